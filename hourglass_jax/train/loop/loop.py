"""The training loop: lock the workdir, resume, train with progress and summaries, evaluate, checkpoint, stop
cleanly on NaN, SIGTERM or Ctrl-C. Metrics are fetched one step late and batches are placed on the devices ahead
(train/loop/prefetch.py), so the host never waits for the device it is feeding."""

import math
import sys
import time

import jax
import ml_collections
import numpy as np
from jax.experimental import multihost_utils
from tqdm import tqdm

from hourglass_jax import generation
from hourglass_jax.config.run import RunConfig, run_config
from hourglass_jax.runtime import compile_cache, distributed, paths, sharding
from hourglass_jax.train.checkpointing.checkpoint import Checkpoints, config_record
from hourglass_jax.train.checkpointing.workdir_lock import WorkdirLock
from hourglass_jax.train.checks import TrainError, warmup_warning
from hourglass_jax.train.compiled.trainer import Trainer
from hourglass_jax.train.loop.evaluate import describe, evaluate
from hourglass_jax.train.loop.preemption import StopSignals
from hourglass_jax.train.loop.prefetch import DevicePrefetch
from hourglass_jax.train.loop.progress import progress_bar
from hourglass_jax.train.reporting import metrics as metrics_lib
from hourglass_jax.train.reporting import run_files
from hourglass_jax.train.reporting.report import example_prompt, report_compiled
from hourglass_jax.train.reporting.run_files import MetricsLog


def log_main(message: str) -> None:
  """Prints on process 0 only, above the progress bar; flushed, so piped logs (pods, SLURM) stay current."""
  if jax.process_index() == 0:
    tqdm.write(message)
    sys.stdout.flush()


class _Meter:
  """Running loss / grad norm and wall time over the steps since the last log line."""

  def __init__(self):
    self.steps_total, self.seconds_total = 0, 0.0
    self.reset()

  def reset(self):
    self.start, self.steps, self.loss, self.grad_norm = time.perf_counter(), 0, 0.0, 0.0

  def add(self, loss: float, grad_norm: float):
    self.steps, self.loss, self.grad_norm = self.steps + 1, self.loss + loss, self.grad_norm + grad_norm

  def flush(self) -> tuple[float, float, float]:
    """(mean loss, mean grad norm, seconds per step) of the window, then starts a new window."""
    seconds = time.perf_counter() - self.start
    self.steps_total, self.seconds_total = self.steps_total + self.steps, self.seconds_total + seconds
    out = self.loss / self.steps, self.grad_norm / self.steps, seconds / self.steps
    self.reset()
    return out


def train_and_evaluate(cfg: "RunConfig | ml_collections.ConfigDict", workdir, *, devices=None,
                       log=log_main) -> dict:
  """Trains the run config `cfg` (a RunConfig, or a config file's ConfigDict, made into one here) in `workdir`
  (resuming from its newest checkpoint) and returns a summary of this call: losses per step, last eval, throughput,
  train-step compile time and persistent-cache hits, and why it stopped ('done', 'preempted' by SIGTERM / a
  preemption notice, 'interrupted' by Ctrl-C; both after saving)."""
  run = run_config(cfg)  # every setting checked here, before anything is read or compiled
  workdir = paths.as_path(workdir)
  mesh = sharding.make_mesh(run.mesh, devices)
  trainer = Trainer(run, mesh)  # the mesh and data checks happen here, before compiling
  if warning := warmup_warning(run.train):
    log(f"warning: {warning}")
  _check_run_files(workdir, log)
  saving = run.checkpoint
  with jax.set_mesh(mesh), WorkdirLock(workdir, log), StopSignals(log) as signals, Checkpoints(
      workdir / "checkpoints", saving.every_steps, saving.keep, saving.async_save, log) as checkpoints:
    restored = checkpoints.restore_latest(trainer.abstract, config_record(run), saving.allow_settings_change,
                                          saving.allow_unverified)
    if restored and restored[2] >= run.train.steps:
      log(f"{checkpoints.directory} already holds step {restored[2]} >= train.steps={run.train.steps}: nothing "
          "to train. Raise --config.train.steps to continue, use a new --workdir to start over, or evaluate it "
          "with hourglass-eval.")
      return dict(start_step=restored[2], step=restored[2], losses={}, eval=None, stopped="done", sample=None)
    cache, begin = compile_cache.counts(), time.perf_counter()
    compiled = trainer.compile_train_step()
    seconds, cache = time.perf_counter() - begin, compile_cache.counts() - cache
    perf = report_compiled(trainer, compiled, log)
    log(f"compile: {seconds:.1f} s ({compile_cache.describe(cache)})")
    main = jax.process_index() == 0
    with metrics_lib.SummaryWriter(str(workdir), main) as writer:
      metrics_log = MetricsLog(workdir, restored[2] if restored else 0, main, log)
      try:
        return dict(_train(trainer, compiled, perf, restored, checkpoints, signals, writer, metrics_log, log),
                    compile_seconds=seconds, compile_cache_hits=cache.hits, compile_saved_seconds=cache.saved_seconds)
      finally:
        metrics_log.close()


def _check_run_files(workdir, log) -> None:
  """The metrics.jsonl the run will append to, read back on process 0 before anything compiles: damaged, a folder
  or a link is refused on every process, naming the file (and line) and the fix."""
  error = None
  if jax.process_index() == 0:
    try:
      if note := run_files.check_metrics(workdir):
        log(f"note: {note}")
    except ValueError as refused:
      error = refused
  if jax.process_count() > 1 and multihost_utils.broadcast_one_to_all(np.int32(error is not None)):
    raise error or TrainError(f"process 0 refused {workdir / run_files.METRICS_FILE}; see its log.")
  if error is not None:
    raise error


def _train(trainer: Trainer, compiled, perf: dict, restored, checkpoints: Checkpoints, signals: StopSignals,
           writer, metrics_log: MetricsLog, log) -> dict:
  run = _Run(trainer, perf, restored, checkpoints, writer, metrics_log, log)
  try:
    state = run.steps(compiled, signals)
  finally:
    run.bar.close()
  return run.finish(state)


class _Run:
  """One call's training: the steps (metrics fetched one step late, `drain`), checkpoints, evaluations, and what
  is logged of them (progress bar, TensorBoard, metrics.jsonl); `summary` is what the call returns."""

  def __init__(self, trainer: Trainer, perf: dict, restored, checkpoints: Checkpoints, writer, metrics_log, log):
    self.trainer, self.perf, self.checkpoints, self.writer, self.metrics_log, self.log = (
        trainer, perf, checkpoints, writer, metrics_log, log)
    self.run, self.total, self.record = trainer.run, trainer.run.train.steps, config_record(trainer.run)
    self.unit = trainer.run.data.spec.unit
    self.batches = DevicePrefetch(trainer.train_iterator(), trainer.global_array)
    self.resumed = restored is not None
    if restored:
      self.state, data_state, self.start = restored
      self.batches.set_state(data_state)
      log(f"resuming from step {self.start} (checkpoint in {checkpoints.directory})")
    else:
      self.state, self.start = trainer.init_state(), 0
    self.summary = dict(start_step=self.start, step=self.start, losses={}, eval=None, stopped="done", sample=None)
    self.tokens_per_step = trainer.batch_size * trainer.seq_len
    self.meter, self.pending, self.saved = _Meter(), None, (checkpoints.all_steps() or [None])[-1]
    self.bar = progress_bar(total=self.total, initial=self.start, desc="train", unit="step",
                            disable=jax.process_index() != 0, dynamic_ncols=True, bar_format=_BAR)  # no rate: the
    self.warned_mfu, self.warned_rates, self.train_extras, self.losses = False, set(), {}, ""  # postfix has it

  def steps(self, compiled, signals: StopSignals):
    """Trains to train.steps (or a stop signal); returns the last state."""
    train, checkpoints, state = self.run.train, self.checkpoints, self.state
    distributed.barrier("train_loop_start")  # all processes compiled and restored: start the first step together
    for step in range(self.start + 1, self.total + 1):
      state, device_metrics = compiled(state, next(self.batches))
      checkpoints.check_save()  # a save that failed in the background stops the run here, not at the next save
      self.drain()
      self.pending = (step, device_metrics)
      self.summary["step"] = step
      stop = signals.requested or (checkpoints.manager.reached_preemption(step) and "preemption")
      if stop or step == self.total or checkpoints.manager.should_save(step):
        self.drain()  # a checkpoint is written only after its step's loss, gradients and update were checked finite
        checkpoints.save(step, state, self.batches.get_state(), self.record, force=True)
        self.saved = step
        self.meter.reset()
      if stop:
        checkpoints.wait()
        self.summary["stopped"] = "interrupted" if stop == "SIGINT" else "preempted"
        self.log(f"\n{'Ctrl-C' if stop == 'SIGINT' else 'SIGTERM/preemption'}: saved checkpoint step {step} in "
                 f"{checkpoints.directory}; rerun the same command to resume.")
        break
      if step == self.total or (train.eval_every and step % train.eval_every == 0):
        self.drain()
        self.evaluate(step, state)
    self.drain()
    if self.losses:
      self.bar.set_postfix_str(self.losses, refresh=False)  # the run's speed is the line `finish` logs
    return state

  def drain(self):
    """Fetches the pending step's metrics (its successor is already queued), checks and logs them."""
    if self.pending is None:
      return
    (step, device_metrics), self.pending = self.pending, None
    values = {k: float(v) for k, v in sharding.to_host(device_metrics).items()}
    if not all(math.isfinite(values[k]) for k in ("loss", "grad_norm", "update_norm")):
      raise TrainError(_divergence_message(step, values, self.saved, self.start if self.resumed else None,
                                           self.checkpoints, self.run.train.eps))
    self.summary["losses"][step] = values["loss"]
    self.train_extras = {name: values[name] for name in values if name not in _STEP_METRICS}
    self.meter.add(values["loss"], values["grad_norm"])
    self.bar.update(1)
    if step % self.run.train.log_every == 0 or step == self.total:
      self.log_window(step, values)

  def log_window(self, step: int, values: dict):
    """The steps since the last log line: their mean loss and speed, on the bar, in TensorBoard and metrics.jsonl."""
    perf, unit, tokens = self.perf, self.unit, self.tokens_per_step
    loss, grad_norm, seconds = self.meter.flush()
    mfu = perf["model_flops"] / seconds / perf["peak_flops"] if perf["model_flops"] else float("nan")
    warning = metrics_lib.mfu_above_peak(mfu, perf["peak_flops_per_device"], perf["peak_source"])
    if warning and not self.warned_mfu:
      self.warned_mfu = True
      self.log(f"warning: {warning}")
    self.losses = (f"loss {loss:.3f}, bits/{unit} {loss / math.log(2):.3f}"
                   + "".join(f", {bar_label(name)} {value:.3g}" for name, value in self.train_extras.items()))
    self.bar.set_postfix_str(f"{self.losses}, {tokens / seconds:,.0f} tok/s, {seconds * 1e3:.0f} ms/step, MFU "
                             f"{mfu:.1%}", refresh=False)
    # what the model reports beside the LM loss (auxiliary losses, sown metrics) comes last, from this step
    self.write_metrics(dict(step=step, split="train", loss=loss, **{f"bits_per_{unit}": loss / math.log(2)},
                            tokens_seen=self.metrics_log.tokens_seen(step, tokens),
                            tokens_per_second=tokens / seconds, step_time_s=seconds,
                            **({"mfu": mfu} if math.isfinite(mfu) else {}), learning_rate=values["learning_rate"],
                            grad_norm=grad_norm, update_norm=values["update_norm"], **self.train_extras), "train")

  def write_metrics(self, record: dict, tag: str):
    """One metrics record, to metrics.jsonl and TensorBoard (under `tag`)."""
    self.metrics_log.write(record)
    self.writer.scalars(record["step"], metrics_lib.scalars_of(record, tag))

  def evaluate(self, step: int, state):
    """The periodic evaluation (partial unless data.eval_batches is 0), logged; boundary rates that drift apart
    between training and evaluation warned once per level."""
    unit, split = self.unit, self.run.data.eval_split
    result = self.summary["eval"] = evaluate(self.trainer, state.params, split, self.run.data.eval_batches)
    tag = "eval" if result["whole_split"] else "eval_partial"  # a partial score is never shown as the split's
    self.write_metrics(dict(step=step, split=split, loss=result["loss"], **{f"bits_per_{unit}": result["bits"]},
                            tokens_seen=self.metrics_log.tokens_seen(step, self.tokens_per_step),
                            whole_split=result["whole_split"], batches=result["batches"],
                            total_batches=result["total_batches"], **result["metrics"]), tag)
    self.log(f"step {step}: {describe(result, split)}")
    for name, warning in metrics_lib.boundary_rates_apart(self.train_extras, result["metrics"]).items():
      if name not in self.warned_rates:  # once per level
        self.warned_rates.add(name)
        self.log(f"warning: {warning}")
    self.meter.reset()

  def finish(self, state) -> dict:
    """The run's speed, the end-of-run sample, and the summary (once the last checkpoint is written)."""
    run, summary, perf, meter = self.run, self.summary, self.perf, self.meter
    if meter.steps_total:
      seconds = meter.seconds_total / meter.steps_total
      summary.update(tokens_per_second=self.tokens_per_step / seconds, step_seconds=seconds,
                     mfu=perf["model_flops"] / seconds / perf["peak_flops"] if perf["model_flops"] else None)
      self.log(f"speed over {meter.steps_total} timed steps (evaluation and checkpoints excluded): "
               f"{summary['tokens_per_second']:,.0f} tokens/s, {seconds * 1e3:.0f} ms/step, "
               f"MFU {summary['mfu'] or float('nan'):.2%} (vs {perf['peak_source']})")
    text_data = run.data.spec.kind == "text"
    if text_data:
      summary["prompt"] = example_prompt(eval_text(self.trainer.eval_source(run.data.eval_split)))
    if summary["stopped"] == "done" and run.train.sample_bytes and text_data:
      summary["sample_prompt"], summary["sample"] = end_of_run_sample(self.trainer, state.params)
      text = (summary["sample_prompt"] + summary["sample"]).decode("utf-8", errors="replace")
      self.writer.text(summary["step"], "sample", text)
      self.log(f"sample ({len(summary['sample_prompt'])} prompt bytes from the {run.data.eval_split} split, then "
               f"{len(summary['sample'])} sampled bytes):\n{text}")
    self.checkpoints.wait()
    return summary


SAMPLE_TEMPERATURE = 0.8  # the end-of-run sample's
_BAR = "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} [{elapsed}<{remaining}{postfix}]"


def bar_label(metric: str) -> str:
  """A sown metric's short name on the progress bar: its last path part, with the level ('boundary_rate[2]') where
  the sowing module is nested in inner levels (TensorBoard keeps the whole path)."""
  depth = metric.split("/").count("inner")
  return metric.rsplit("/", 1)[-1] + (f"[{depth + 1}]" if depth else "")


def eval_text(source, size: int = 4096) -> bytes:
  """The first `size` bytes (about) of an eval split's windows, for `example_prompt`."""
  parts, count = [], 0
  for i in range(len(source)):
    if count >= size:
      break
    parts.append(bytes(np.asarray(source[i]).astype("uint8")))
    count += len(parts[-1])
  return b"".join(parts)


def end_of_run_sample(trainer: Trainer, params) -> tuple[bytes, bytes]:
  """(prompt, continuation): the first bytes of the eval split (up to 64, a quarter of data.seq_len) continued by
  train.sample_bytes bytes at temperature 0.8 and seed train.seed, with hourglass-sample's generation path (the KV
  cache; longer than data.seq_len extrapolates). Runs on every process, on the training mesh and shardings."""
  run = trainer.run
  window = trainer.eval_source(run.data.eval_split)[0]
  prompt = bytes(window[:max(1, min(64, trainer.seq_len // 4))].astype("uint8"))
  generated = generation.generate_on_mesh(
      params, trainer.shardings.params, trainer.model.cfg,
      generation.byte_prompts(prompt, 1, run.model.vocab_size), trainer.mesh, trainer.rules,
      max_new_tokens=run.train.sample_bytes, seed=run.train.seed, temperature=SAMPLE_TEMPERATURE)
  return prompt, generation.texts(b"", generated.tokens)[0]


_STEP_METRICS = ("loss", "grad_norm", "update_norm", "learning_rate")


TINY_EPS = 1e-12  # an Adam eps below this lets a near-zero second moment blow an update up


def _divergence_message(step: int, values: dict, saved: int | None, resumed_from: int | None, checkpoints,
                        eps: float = 1e-9) -> str:
  """Names the likely cause: a suspect checkpoint when the run diverges before its first save after resuming
  from it; train.eps when the gradients are finite but the update is not (Adam divides by sqrt(v) + eps) or eps is
  tiny; the optimisation settings otherwise."""
  head = (f"training diverged at step {step}: loss {values['loss']}, gradient norm {values['grad_norm']}, update "
          f"norm {values['update_norm']}; stopped without saving it. ")
  if resumed_from is not None and saved == resumed_from:
    older = [s for s in checkpoints.all_steps() if s < resumed_from]
    fallback = f"resume from step {older[-1]} instead" if older else "start afresh"
    return head + (f"It diverged {step - resumed_from} step(s) after resuming from checkpoint step {resumed_from}, "
                   "so that checkpoint is suspect (damaged in memory before it was saved, or trained into a bad "
                   f"region). Move {checkpoints.directory / str(resumed_from)} into "
                   f"{checkpoints.directory.parent / 'checkpoints_unreadable'}/ to {fallback}, then rerun; if it "
                   "diverges again, lower train.learning_rate or set train.grad_clip_norm.")
  intact = f"The last checkpoint (step {saved}) is intact. " if saved is not None else ""
  update_only = math.isfinite(values["grad_norm"]) and not math.isfinite(values["update_norm"])
  if update_only or eps < TINY_EPS:
    why = ("The gradients are finite but the optimizer's update is not: " if update_only else "")
    return head + intact + (f"{why}Adam divides by sqrt(v) + train.eps, and train.eps={eps:g} lets a near-zero "
                            "second moment blow an update up; raise it (--config.train.eps=1e-8), then rerun.")
  return head + intact + "Lower train.learning_rate, raise train.warmup_steps or set train.grad_clip_norm, then rerun."
