"""Checkpoints of the per-block parameter layout (before stacks were scanned: `pre/block_0/...`, `pre/block_1/...`)
-> the scanned layout (`pre/blocks/...` with a leading layer axis). `hourglass-convert --workdir=DIR` rewrites a
run's checkpoints; the old ones are kept aside in DIR/checkpoints_per_block/."""

import re
from collections.abc import Mapping

import jax
import numpy as np
import orbax.checkpoint as ocp

from hourglass_jax import paths
from hourglass_jax.train.checkpoint import array_shapes, has_per_block_layout
from hourglass_jax.train import integrity
from hourglass_jax.train.checks import TrainError
from hourglass_jax.train.workdir_lock import WorkdirLock

_BLOCK = re.compile(r"^block_(\d+)$")
OLD_LAYOUT_DIR = "checkpoints_per_block"


def _block_count(tree: Mapping) -> int:
  """n when the mapping's block entries are exactly block_0 .. block_{n-1}, else 0."""
  indices = sorted(int(m.group(1)) for m in map(_BLOCK.match, tree) if m)
  return len(indices) if indices and indices == list(range(len(indices))) else 0


def stack_blocks(tree):
  """Any nested mapping with `block_0 .. block_{n-1}` entries gets them stacked into one `blocks` entry (leaves
  stacked on a new leading axis); works on params and on optimizer states that mirror them."""
  if isinstance(tree, Mapping):
    out = {name: stack_blocks(sub) for name, sub in tree.items() if not _BLOCK.match(str(name))}
    if n := _block_count(tree):
      blocks = [stack_blocks(tree[f"block_{i}"]) for i in range(n)]
      out["blocks"] = jax.tree.map(lambda *leaves: np.stack([np.asarray(x) for x in leaves]), *blocks)
    return out
  if isinstance(tree, (list, tuple)):
    return type(tree)(stack_blocks(sub) for sub in tree)
  return tree


def unstack_blocks(tree):
  """The inverse of stack_blocks (writes the old layout; used by tests and to hand weights to older code)."""
  if isinstance(tree, Mapping):
    out = {name: unstack_blocks(sub) for name, sub in tree.items() if name != "blocks"}
    if "blocks" in tree:
      blocks = unstack_blocks(tree["blocks"])
      for i in range(len(jax.tree.leaves(blocks)[0])):
        out[f"block_{i}"] = jax.tree.map(lambda x: np.asarray(x)[i], blocks)
    return out
  if isinstance(tree, (list, tuple)):
    return type(tree)(unstack_blocks(sub) for sub in tree)
  return tree


def _handlers():
  return dict(state=ocp.StandardCheckpointHandler(), data=ocp.JsonCheckpointHandler())


def convert_workdir(workdir, log=print) -> list[int]:
  """Rewrites every checkpoint under `workdir`/checkpoints to the scanned layout (step, data position and
  metadata kept); the originals move to `workdir`/checkpoints_per_block. Returns the converted steps."""
  workdir = paths.as_path(workdir)
  source, staging, aside = workdir / "checkpoints", workdir / "checkpoints_converting", workdir / OLD_LAYOUT_DIR
  if not source.exists():
    raise TrainError(f"{source} does not exist: --workdir must be the folder hourglass-train wrote (it holds "
                     "checkpoints/).")
  with WorkdirLock(workdir, log):  # a run training in this workdir would write checkpoints being converted
    return _convert(source, staging, aside, log)


def _convert(source, staging, aside, log) -> list[int]:
  if aside.exists():
    raise TrainError(f"{aside} already exists (a previous conversion); move it away first so it is not "
                     "overwritten.")
  reader = ocp.CheckpointManager(source, item_handlers=_handlers(),
                                 options=ocp.CheckpointManagerOptions(read_only=True, create=False))
  steps = sorted(reader.all_steps())
  if not steps:
    raise TrainError(f"{source} holds no checkpoint to convert.")
  if not has_per_block_layout(array_shapes(reader.item_metadata(steps[-1])["state"].tree)):
    log(f"{source}: already in the scanned layout; nothing to do.")
    return []
  options = ocp.CheckpointManagerOptions(enable_async_checkpointing=False, create=True)
  with ocp.CheckpointManager(staging, item_handlers=_handlers(), options=options) as writer:
    for step in steps:
      restored = reader.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(),
                                                             data=ocp.args.JsonRestore()))
      state = stack_blocks(dict(restored.state))
      metadata = dict(reader.metadata(step).custom_metadata or {}, fingerprints=integrity.array_fingerprints(state),
                      data_fingerprint=integrity.json_fingerprint(restored.data))
      writer.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                data=ocp.args.JsonSave(restored.data)),
                  custom_metadata=metadata, force=True)
      log(f"converted step {step}")
  reader.close()
  source.rename(aside)
  staging.rename(source)
  log(f"{len(steps)} checkpoint(s) converted to the scanned layout in {source}; the originals are in {aside}.")
  return steps
