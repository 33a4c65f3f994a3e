"""What checkpoint fingerprints cost: save and restore of the enwik8-shaped train state (configs/enwik8.py, float32,
parameters + Adam moments) with and without them, interleaved, on the local disk.

    .venv/bin/python benchmarks/checkpoint_integrity.py [--quick] [--rounds N] [--directory DIR]

`save` is Checkpoints.save + wait (Orbax writes the arrays; with fingerprints, one jitted pass over the state on its
devices first); `restore` is restore_latest (with fingerprints, the same pass over the restored state). Results:
benchmarks/results/checkpoint_integrity.json.
"""

import argparse
import shutil
import tempfile
import time

from common import append_result, interleave, load_config, loadavg, median, paired_ratios, parse_with_quick


def _trainer_and_state(model: dict):
  import jax

  from hourglass_jax.config import run_config
  from hourglass_jax.runtime import sharding
  from hourglass_jax.train.compiled.trainer import Trainer

  cfg = load_config("enwik8")
  cfg.model.update(model)
  cfg.data.update(name="synthetic", batch_size=1)
  cfg.mesh.update(data=1)
  trainer = Trainer(run_config(cfg), sharding.make_mesh(cfg.mesh, jax.devices()[:1]))
  with jax.set_mesh(trainer.mesh):
    state = trainer.init_state()
  return cfg, trainer, jax.block_until_ready(state)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--directory", default=None, help="where to write the checkpoints (default: a temp dir)")
  parser.add_argument("--quick", action="store_true", help="a narrow model, 2 rounds")
  parser.add_argument("--name", default="checkpoint_integrity")
  args = parse_with_quick(parser, argv, dict(rounds=2))
  import jax
  import orbax.checkpoint as ocp

  from hourglass_jax.train.checkpointing import integrity
  from hourglass_jax.train.checkpointing.checkpoint import Checkpoints, config_record

  model = dict(d_model=128, num_heads=2, d_ff=512) if args.quick else {}
  cfg, trainer, state = _trainer_and_state(model)
  state_bytes = sum(x.nbytes for x in jax.tree.leaves(state))
  print(f"enwik8 train state: {trainer.num_params / 1e6:.1f}M parameters, {state_bytes / 2**20:,.0f} MiB in all "
        f"(load {loadavg()})", flush=True)
  root = tempfile.mkdtemp(dir=args.directory, prefix="ckpt_bench_")
  record, data = config_record(trainer.run), {"next_index": 7}
  steps = iter(range(1, 10**6))

  def save(fingerprints: bool):
    def call():
      directory = f"{root}/{'on' if fingerprints else 'off'}"
      shutil.rmtree(directory, ignore_errors=True)
      with Checkpoints(directory, keep=1, log=lambda m: None) as checkpoints:
        if fingerprints:
          checkpoints.save(next(steps), state, data, record, force=True)
        else:  # the same save, without the fingerprint pass
          checkpoints.manager.save(next(steps), force=True, custom_metadata=record, args=ocp.args.Composite(
              state=ocp.args.PyTreeSave(state), data=ocp.args.JsonSave(data)))
    return call

  def restore(verify: bool):
    def call():
      with Checkpoints(f"{root}/on", log=lambda m: None, read_only=True) as checkpoints:
        if verify:
          restored = checkpoints.restore_latest(trainer.abstract, record)[0]
        else:  # what restore_latest did before fingerprints: the structure check, then the restore
          step = checkpoints.all_steps()[-1]
          checkpoints.check_compatible(step, trainer.abstract, record)
          restored = checkpoints.manager.restore(step, args=ocp.args.Composite(
              state=ocp.args.PyTreeRestore(trainer.abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(
                  trainer.abstract)), data=ocp.args.JsonRestore())).state
        jax.block_until_ready(restored)
    return call

  def fingerprint_only():
    integrity.array_fingerprints(state)

  fingerprint_only()  # compile it once, outside the timing
  with jax.set_mesh(trainer.mesh):
    save(True)()
    timed = interleave({"save": save(False), "save+fingerprints": save(True), "restore": restore(False),
                               "restore+verify": restore(True), "fingerprints": fingerprint_only}, args.rounds)
  times, loads = timed["times"], [round(x, 2) for x in timed["loads"]]
  shutil.rmtree(root, ignore_errors=True)
  figures = {name: round(median(t), 3) for name, t in times.items()}
  ratios = dict(save=round(median(paired_ratios(times["save+fingerprints"], times["save"])), 3),
                restore=round(median(paired_ratios(times["restore+verify"], times["restore"])), 3))
  for name, seconds in figures.items():
    print(f"{name:>18}: {seconds:.3f} s (median of {len(times[name])})")
  print(f"with fingerprints: save x{ratios['save']}, restore x{ratios['restore']}; the fingerprint pass alone "
        f"{figures['fingerprints']:.3f} s = {state_bytes / 2**30 / figures['fingerprints']:.1f} GiB/s "
        f"(load at each round: {loads})")
  path = append_result(args.name, dict(model=model or "enwik8", state_mib=round(state_bytes / 2**20), seconds=figures,
                                       ratios=ratios, loads=loads, rounds=args.rounds))
  print(f"wrote {path}")


if __name__ == "__main__":
  main()
