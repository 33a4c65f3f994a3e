"""What a run checks once it has a mesh and its data (the settings themselves are checked when the RunConfig is
made, hourglass_jax/config/run.py): the batch split over devices and processes, the training windows; the schedule's
warmup warning; and the errors training raises."""

from hourglass_jax.config.train_settings import TrainSettings
from hourglass_jax.data.batches.settings import DataSettings


class TrainError(RuntimeError):
  """A fault during training (NaN loss, unreadable or mismatched checkpoint, full disk, too little memory)."""


class DiskFullError(TrainError):
  """A write under the workdir failed for lack of space (hourglass-train exits with EXIT_DISK_FULL)."""


def warmup_warning(train: TrainSettings) -> str | None:
  """A schedule whose warmup does not end before the last step never reaches train.learning_rate: the last step
  (index steps - 1) takes learning_rate x (steps - 1) / warmup_steps."""
  if train.warmup_steps < train.steps:
    return None
  lr, last = train.learning_rate, train.learning_rate * (train.steps - 1) / train.warmup_steps
  digits = next((n for n in range(3, 17) if f"{last:.{n}g}" != f"{lr:.{n}g}"), 17)  # enough to tell them apart
  return (f"train.warmup_steps={train.warmup_steps} >= train.steps={train.steps}: the learning rate never reaches "
          f"train.learning_rate={lr:g} (the last step's is {last:.{digits}g}, {last / lr:.{max(digits - 2, 1)}%} of "
          f"it); set --config.train.warmup_steps={train.steps // 10} or raise --config.train.steps.")


def check_batch_split(data: DataSettings, train: TrainSettings, parallelism: int, process_count: int) -> None:
  """The (micro-)batch must split evenly over the data-parallel devices and the processes."""
  micro = data.batch_size // train.grad_accum_steps
  if micro % parallelism:
    raise ValueError(f"data.batch_size={data.batch_size} (micro-batch {micro}) is not divisible by the "
                     f"{parallelism} data-parallel devices (mesh data x fsdp); use a multiple of "
                     f"{parallelism * train.grad_accum_steps} or change the mesh.")
  if data.batch_size % process_count:
    raise ValueError(f"data.batch_size={data.batch_size} is not divisible by the {process_count} processes.")


def check_train_windows(data: DataSettings, windows: int) -> None:
  """One batch needs batch_size training windows; fewer would repeat windows within every batch."""
  if windows < data.batch_size:
    raise ValueError(f"the train split of data.name={data.name!r} yields {windows} training windows (seq_len + 1 "
                     f"= {data.seq_len + 1} tokens each), fewer than one batch of data.batch_size="
                     f"{data.batch_size}; lower data.batch_size, data.train_stride or data.seq_len, or use a "
                     "larger corpus.")
