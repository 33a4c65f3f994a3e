"""Pod-scale presets of the paper configs, chosen with `--config=configs/<name>.py:<preset>`: a global batch, a
mesh (data / fsdp / tensor, -1 = the rest of the devices) and the schedule rescaled so a run sees the paper's
number of tokens. docs/SCALING.md explains how to pick one for a slice and how to adapt it."""

import ml_collections

# pod:        pure data parallel; every device holds the whole model (these models are 40-150M parameters).
# pod_fsdp:   parameters and optimizer state sharded over groups of 4 devices (ZeRO-3), the batch over all.
# pod_tensor: attention heads and MLP columns split 4 ways (Megatron), for long sequences whose activations do
#             not fit; the batch splits over the other devices only, hence half the batch. With rematerialisation.
POD_PRESETS = {
    "pod": dict(batch_size=64, mesh=dict(data=-1, fsdp=1, tensor=1)),
    "pod_fsdp": dict(batch_size=64, mesh=dict(data=-1, fsdp=4, tensor=1)),
    "pod_tensor": dict(batch_size=32, mesh=dict(data=-1, fsdp=1, tensor=4), remat_policy="nothing_saveable"),
}
# imagenet64 (12288 positions): the paper's one image per device on a 16-device slice, with rematerialisation; the
# attention scores of one 12288-long row are 4.8 GB per layer on the XLA attention path.
LONG_SEQUENCE_PRESETS = {
    "pod": dict(batch_size=16, mesh=dict(data=-1, fsdp=1, tensor=1), remat_policy="nothing_saveable"),
    "pod_fsdp": dict(batch_size=16, mesh=dict(data=-1, fsdp=4, tensor=1), remat_policy="nothing_saveable"),
    "pod_tensor": dict(batch_size=16, mesh=dict(data=-1, fsdp=1, tensor=4), remat_policy="nothing_saveable"),
}


def apply_preset(cfg: ml_collections.ConfigDict, preset: str, config_name: str,
                 presets: dict | None = None) -> ml_collections.ConfigDict:
  """`cfg` with `preset` applied; '' keeps the paper's single-host settings. Steps, warmup, eval and checkpoint
  intervals and eval batches scale by paper batch / new batch (the same tokens); the learning rate is kept (not
  retuned for the larger batch)."""
  presets = POD_PRESETS if presets is None else presets
  if not preset:
    return cfg
  if preset not in presets:
    raise ValueError(f"configs/{config_name}.py: unknown preset {preset!r}; choose one of {', '.join(presets)} "
                     f"(e.g. --config=configs/{config_name}.py:pod), or none for the paper's settings.")
  chosen = presets[preset]
  ratio = cfg.data.batch_size / chosen["batch_size"]

  def scaled(steps: int, least: int) -> int:
    return max(least, round(steps * ratio)) if steps else 0

  cfg.data.batch_size = chosen["batch_size"]
  cfg.mesh.update(chosen["mesh"])
  cfg.train.update(steps=scaled(cfg.train.steps, 1), warmup_steps=scaled(cfg.train.warmup_steps, 1),
                   eval_every=scaled(cfg.train.eval_every, 100))
  cfg.model.remat_policy = chosen.get("remat_policy", cfg.model.remat_policy)
  cfg.checkpoint.every_steps = scaled(cfg.checkpoint.every_steps, 100)
  cfg.data.eval_batches = scaled(cfg.data.eval_batches, 1)  # 0 (the whole split) stays 0
  return cfg
