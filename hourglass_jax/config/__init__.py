"""Config scaffolding: the shared skeleton of every config file (base.py), the --config flag (flag.py) and the
pod-scale presets (pod_scale.py)."""
