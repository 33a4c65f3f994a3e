"""What a run prints before its first step: model size, FLOPs per step, compiled memory, and the MFU peak; and
after its last, the commands that use it (`next_steps`)."""

import collections
import re
import shlex

import jax

from hourglass_jax.model import counting
from hourglass_jax.train.reporting import metrics


def model_flops_per_step(run) -> int | None:
  """Analytic training FLOPs of one step of the RunConfig `run`: 3x the forward matmul FLOPs (forward + backward)
  per sequence."""
  try:
    forward = counting.forward_flops(run.model, run.data.seq_len)
  except Exception:  # model kinds the analytic counter does not cover
    return None
  return 3 * forward * run.data.batch_size


def report_compiled(trainer, compiled, log) -> dict:
  """Logs the run's shape and cost; raises TrainError when the step cannot fit in device memory."""
  run, mesh = trainer.run, trainer.mesh
  xla_flops = metrics.cost_flops(compiled)
  model_flops = model_flops_per_step(run)
  needed, limit = metrics.memory_bytes(compiled), metrics.device_memory_limit()
  peak, peak_source = metrics.peak_flops_per_device(run.train.peak_flops_per_device, run.model.dtype)
  devices = mesh.devices.size
  mesh_text = " x ".join(f"{name}={size}" for name, size in mesh.shape.items())
  accum = f", {run.train.grad_accum_steps} micro-batches" if run.train.grad_accum_steps > 1 else ""
  remat_text = f", remat ({run.model.remat_policy})" if run.model.remat_policy != "none" else ""
  log(f"model: {run.model.kind} {run.model.hierarchy}, {trainer.num_params:,} params, "
      f"dtype {run.model.dtype}{remat_text}")
  log(f"devices: {devices} x {jax.devices()[0].device_kind} in {jax.process_count()} process(es), mesh "
      f"{mesh_text}; batch {trainer.batch_size} x {trainer.seq_len} tokens{accum}")
  flops_text = f"{model_flops / 1e9:,.2f} GFLOPs/step (model, 3x forward)" if model_flops else "model FLOPs n/a"
  if xla_flops is not None:
    flops_text += f", {xla_flops * devices / 1e9:,.2f} GFLOPs/step (XLA, all devices, loop bodies counted once)"
  memory_text = f"{needed / 2**20:,.1f} MiB/device" if needed is not None else "n/a"
  limit_text = f" of {limit / 2**30:,.1f} GiB" if limit else ""
  log(f"compiled: {flops_text}; memory {memory_text}{limit_text}; MFU peak {peak / 1e12:,.3f} TFLOP/s/device "
      f"({peak_source})")
  metrics.check_memory(needed, limit)
  if model_flops is None and xla_flops is not None:
    model_flops = xla_flops * devices
  return dict(model_flops=model_flops, xla_flops=xla_flops, memory=needed, peak_flops=peak * devices,
              peak_flops_per_device=peak, peak_source=peak_source)


def example_prompt(text: bytes) -> str | None:
  """A prompt in the style of `text` (the start of a text run's eval split): its most frequent word and a space
  ('the ' for English prose), else its first character; None for no text."""
  decoded = text.decode("utf-8", errors="ignore")
  words = collections.Counter(re.findall(r"[^\W\d_]{2,}", decoded))
  if words:
    return words.most_common(1)[0][0] + " "
  return decoded.strip()[:1] or None


def next_steps(config: str, workdir: str, overrides=(), prompt: str | None = None, bin_dir: str = "") -> str:
  """What a finished run prints last: where its checkpoints, metrics and TensorBoard logs are and the commands that
  sample, evaluate, export and plot it (`config`: the --config argument, `overrides`: the --config.* arguments the
  sample and eval commands need, `prompt`: the sample command's (None: an image model), `bin_dir`: the folder of
  the hourglass-* commands, '' when they are on PATH)."""
  run = " ".join(shlex.quote(arg) for arg in (f"--config={config}", f"--workdir={workdir}", *overrides))
  command = lambda name: shlex.quote(f"{bin_dir}/{name}" if bin_dir else name)
  prompt = f" --prompt={shlex.quote(prompt)}" if prompt else ""
  output = shlex.quote(f"{str(workdir).rstrip('/')}_export")
  folder = str(workdir).rstrip("/")
  return "\n".join([
      f"checkpoints: {folder}/checkpoints (the same command resumes; a larger --config.train.steps trains on)",
      f"metrics: {folder}/metrics.jsonl (one JSON line per logged step) and TensorBoard logs in {workdir}",
      "next:",
      f"  {command('hourglass-sample')} {run}{prompt}",
      f"  {command('hourglass-eval')} {run} --split=test   # the whole split; --batches=N: a quick partial score",
      f"  {command('hourglass-export')} --workdir={shlex.quote(str(workdir))} --output={output}",
      f"  {command('hourglass-plot')} {shlex.quote(str(workdir))} --output={shlex.quote(folder + '/curves.png')}",
      f"  {command('pip')} install tensorboard && {command('tensorboard')} --logdir={shlex.quote(str(workdir))}"])
