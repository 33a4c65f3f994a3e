"""The training system: config checks, optimizer, sharded train state and steps, the loop with checkpoints,
metrics and preemption handling, and checkpoint evaluation (`loop.train_and_evaluate`,
`evaluate.evaluate_checkpoint`)."""
