"""Config scaffolding: the shared skeleton of every config file (base.py), the typed run config made once from it
(run.py: `hourglass_jax.config.run_config(cfg) -> RunConfig`) with its train and checkpoint sections
(train_settings.py; the model, data and mesh sections live with what they configure), the --config flag (flag.py)
and the pod-scale presets (pod_scale.py)."""


def __getattr__(name: str):
  """`run_config` and `RunConfig`, imported on first use: the flag layer imports this package, and run.py imports
  the model and JAX, which `--help` does not need."""
  if name in ("run_config", "RunConfig"):
    from hourglass_jax.config import run  # pylint: disable=import-outside-toplevel

    return getattr(run, name)
  raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
