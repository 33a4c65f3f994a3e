"""`hourglass-data prepare NAME`: build a dataset as array_record files (tfds_io.prepare) and say what was built
and where, reading the splits back to count them."""

import sys
import time

from hourglass_jax.data import catalog
from hourglass_jax.data.builders.text_files import split_warning
from hourglass_jax.data.io import tfds_io
from hourglass_jax.runtime import paths


def _disk_bytes(path) -> int:
  return sum((folder / name).stat().length for folder, _, files in paths.as_path(path).walk() for name in files)


def split_summary(name: str, data_dir: str | None, sizes: dict | None = None) -> list[str]:
  """One line per split: how many bytes (text) or images, and how many records hold them; `sizes` (a dict) gets
  each text split's bytes."""
  from hourglass_jax.data.builders.byte_chunks import ByteStream  # pylint: disable=import-outside-toplevel

  spec, lines, sizes = catalog.get(name), [], {} if sizes is None else sizes
  builder = tfds_io.get_builder(name, data_dir)
  for split in builder.info.splits.keys():
    records = builder.as_data_source(split=split)
    if spec.kind == "text":
      sizes[split] = len(ByteStream(records))
      lines.append(f"  {split}: {sizes[split]:,} bytes in {len(records):,} records")
    else:
      shape = "x".join(map(str, records[0]["image"].shape)) if len(records) else "-"
      lines.append(f"  {split}: {len(records):,} images ({shape})")
  return lines


def prepare_command(name: str, data_dir: str | None = None, manual_dir: str | None = None, log=print) -> str:
  """Builds `name` (unless already there), logs the splits and the location, and returns the dataset's folder."""
  spec = catalog.get(name)
  root = tfds_io.resolve_data_dir(data_dir)
  builder = tfds_io.get_builder(name, str(root))
  if builder.is_prepared():
    log(f"{name} is already prepared at {builder.data_path}; delete that folder to build it again.")
  else:
    log(f"preparing {name} into {root} (needs {spec.needs})")
    start = time.perf_counter()
    # TFDS's progress bars only on a terminal: in a log each shows its first frame alone (and a temporary path)
    builder = tfds_io.prepare(name, str(root), manual_dir, progress=sys.stderr.isatty(), log=log, new_build=True)
    log(f"built {name} in {time.perf_counter() - start:.1f} s")
  path = builder.data_path
  log(f"{name} at {path} ({_disk_bytes(path) / 2**20:.1f} MiB on disk, array_record):")
  sizes = {}
  for line in split_summary(name, str(root), sizes):
    log(line)
  if warning := split_warning(sizes, name, path):
    log(f"warning: {warning}")
  log(f"train on it with --config.data.name={name} --config.data.data_dir={root}")
  return str(path)
