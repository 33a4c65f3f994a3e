"""The training loop and the evaluations it runs (also `hourglass-eval`'s), with the pieces that keep it moving
(device prefetch, preemption signals, progress bars)."""
