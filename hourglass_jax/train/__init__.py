"""The training system, by role, over the settings and errors every part shares (settings.py, checks.py): what a run
compiles (compiled/), what it keeps and reads back (checkpointing/), what it reports (reporting/), and the loop
and evaluation that drive them (loop/: `loop.train_and_evaluate`, `evaluate.evaluate_checkpoint`)."""
