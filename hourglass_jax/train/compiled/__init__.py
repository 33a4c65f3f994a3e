"""What a run compiles on its mesh from a RunConfig (the train state and its layout, the optimizer, the pure
train step), held by `Trainer` and `Evaluator`."""
