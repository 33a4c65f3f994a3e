"""The training system, by role, over the errors every part shares (checks.py) and the train and checkpoint
sections (hourglass_jax/config/train_settings.py): what a run compiles (compiled/), what it keeps and reads back
(checkpointing/), what it reports (reporting/), and the loop and evaluation that drive them (loop:
`loop.train_and_evaluate`, `evaluate.evaluate_checkpoint`)."""
