"""Data pipeline throughput on this CPU: building datasets (examples/s, MB/s) and reading them (examples/s).

Builds, into a temporary directory: an enwik8-structured archive (the stdlib corpus repeated to --enwik8_mb MB,
deflated, the test-only size override), the offline stdlib_text corpus, the digits images, and a CIFAR-shaped set
of random 32x32x3 PNG images (TFDS's Image feature, encoded with PIL as `hourglass-data prepare cifar10` does
without TensorFlow). Reads: random training windows (2049 bytes, stride 512, shuffled) straight from the source
and as grain batches of 8; long-context eval windows (6913 bytes + weights); images as whole sequences.

  .venv/bin/python benchmarks/data_throughput.py [--enwik8_mb 20] [--seconds 3]

Writes benchmarks/results/data_throughput.json and .md.
"""

import argparse
import datetime
import json
import os
import pathlib
import platform
import tempfile
import time
import zipfile

import numpy as np
import tensorflow_datasets as tfds

from hourglass_jax.data import catalog
from hourglass_jax.data.batches import pipeline
from hourglass_jax.data.batches.eval_windows import ScoredWindows
from hourglass_jax.data.batches.image_source import ImageSource
from hourglass_jax.data.batches.sources import WindowSource
from hourglass_jax.data.builders import embedded
from hourglass_jax.data.builders.byte_chunks import ByteStream
from hourglass_jax.data.io import no_tensorflow, tfds_io

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


class RandomPngs(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """CIFAR-shaped stand-in: random 32x32x3 images stored as PNG, decoded with PIL on read."""
  VERSION = tfds.core.Version("1.0.0")
  COUNT = 4000

  def _info(self):
    return tfds.core.DatasetInfo(builder=self, disable_shuffling=True, features=tfds.features.FeaturesDict(
        {"image": tfds.features.Image(shape=(32, 32, 3))}))

  def _split_generators(self, dl_manager):
    return {"train": self._generate_examples()}

  def _generate_examples(self):
    rng = np.random.default_rng(0)
    for i in range(self.COUNT):
      yield i, {"image": rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)}


def timed(fn):
  start = time.perf_counter()
  out = fn()
  return out, time.perf_counter() - start


def rate(read, count: int, seconds: float) -> float:
  """Items per second of read(i) over a seeded random order, run for about `seconds`."""
  order = np.random.default_rng(0).permutation(count)
  done, start = 0, time.perf_counter()
  while time.perf_counter() - start < seconds:
    for i in order[done % count:done % count + 64]:
      read(int(i))
    done += 64
  return done / (time.perf_counter() - start)


def batch_rate(iterator, batch: int, seconds: float) -> float:
  """Examples per second of a batch iterator, run for about `seconds` or until it ends."""
  next(iterator)  # threads started, first prefetch filled
  done, start = 0, time.perf_counter()
  for _ in iterator:
    done += batch
    if time.perf_counter() - start >= seconds:
      break
  return done / (time.perf_counter() - start)


def fake_enwik8(folder: pathlib.Path, megabytes: int) -> int:
  corpus = embedded.stdlib_bytes().tobytes()
  total = megabytes * 10**6
  data = (corpus * (total // len(corpus) + 1))[:total]
  folder.mkdir(parents=True)
  with zipfile.ZipFile(folder / "enwik8.zip", "w", compression=zipfile.ZIP_DEFLATED) as archive:
    archive.writestr("enwik8", data)
  return total


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--enwik8_mb", type=int, default=20)
  parser.add_argument("--seconds", type=float, default=3.0)
  args = parser.parse_args()
  rows, builds = [], []
  with tempfile.TemporaryDirectory() as tmp:
    tmp = pathlib.Path(tmp)
    data_dir, enwik8 = str(tmp / "tfds"), catalog.get("enwik8")
    total = fake_enwik8(tmp / "manual", args.enwik8_mb)
    _, seconds = timed(lambda: tfds_io.prepare("enwik8", data_dir, str(tmp / "manual"),
                                               builder_kwargs=dict(total_bytes=total), progress=False))
    chunks = sum(len(tfds_io.open_split(enwik8, s, data_dir)) for s in ("train", "valid", "test"))
    builds.append(dict(dataset=f"enwik8 layout ({args.enwik8_mb} MB, 16 KiB chunks)", examples=chunks,
                       seconds=seconds, examples_per_s=chunks / seconds, mb_per_s=total / 1e6 / seconds))
    stdlib_mb = sum(f.stat().st_size for f in embedded.stdlib_source_files()) / 1e6
    _, seconds = timed(lambda: tfds_io.prepare("stdlib_text", data_dir, progress=False))
    files = len(embedded.stdlib_source_files())
    builds.append(dict(dataset=f"stdlib_text ({stdlib_mb:.1f} MB, {files} files)", examples=files, seconds=seconds,
                       examples_per_s=files / seconds, mb_per_s=stdlib_mb / seconds))
    _, seconds = timed(lambda: tfds_io.prepare("digits", data_dir, progress=False))
    builds.append(dict(dataset="digits (1,797 images 8x8x1)", examples=1797, seconds=seconds,
                       examples_per_s=1797 / seconds, mb_per_s=1797 * 64 / 1e6 / seconds))
    pngs = RandomPngs(data_dir=data_dir, file_format="array_record")
    with no_tensorflow.without_tensorflow():
      _, seconds = timed(pngs.download_and_prepare)
    builds.append(dict(dataset=f"random PNG 32x32x3 ({RandomPngs.COUNT:,} images)", examples=RandomPngs.COUNT,
                       seconds=seconds, examples_per_s=RandomPngs.COUNT / seconds,
                       mb_per_s=RandomPngs.COUNT * 3072 / 1e6 / seconds))

    train = WindowSource(ByteStream(tfds_io.open_split(enwik8, "train", data_dir)), 2048, 512)
    rows.append(dict(read="enwik8 train windows 2049 B, random order", items=len(train),
                     per_s=rate(train.__getitem__, len(train), args.seconds)))
    rows.append(dict(read="  as grain batches of 8 (shuffled, 2 threads)", items=len(train),
                     per_s=batch_rate(pipeline.train_iterator(train, 0, 8, (0, 8)), 8, args.seconds)))
    valid = ScoredWindows(ByteStream(tfds_io.open_split(enwik8, "valid", data_dir)), 6912, 6784)
    rows.append(dict(read="enwik8 long-context eval windows 6913 B + weights", items=len(valid),
                     per_s=batch_rate(pipeline.eval_iterator(valid, 8, (0, 8)), 8, args.seconds)))
    digits = ImageSource(tfds_io.open_split(catalog.get("digits"), "train", data_dir))
    rows.append(dict(read="digits images -> 65-token sequences", items=len(digits),
                     per_s=rate(digits.__getitem__, len(digits), args.seconds)))
    cifar = ImageSource(pngs.as_data_source(split="train"))
    rows.append(dict(read="PNG 32x32x3 images -> 3073-token sequences", items=len(cifar),
                     per_s=rate(cifar.__getitem__, len(cifar), args.seconds)))
    rows.append(dict(read="  as grain batches of 8 (shuffled, 2 threads)", items=len(cifar),
                     per_s=batch_rate(pipeline.train_iterator(cifar, 0, 8, (0, 8)), 8, args.seconds)))
  write(builds, rows, args)


def write(builds, rows, args):
  meta = dict(date=datetime.date.today().isoformat(), cpus=os.cpu_count(), machine=platform.machine(),
              python=platform.python_version(), tfds=tfds.__version__, load_average=os.getloadavg()[0])
  RESULTS.mkdir(exist_ok=True)
  (RESULTS / "data_throughput.json").write_text(json.dumps(dict(meta=meta, builds=builds, reads=rows), indent=1))
  lines = [f"# Data throughput ({meta['cpus']} CPU cores, TFDS {meta['tfds']} without TensorFlow, array_record, "
           f"load average {meta['load_average']:.1f}, {meta['date']})", "",
           "Measured by benchmarks/data_throughput.py on a shared machine: compare orders of magnitude, not digits.",
           "", "## Build (hourglass-data prepare)", "", "| dataset | examples | seconds | examples/s | MB/s |",
           "|---|---|---|---|---|"]
  lines += [f"| {b['dataset']} | {b['examples']:,} | {b['seconds']:.2f} | {b['examples_per_s']:,.0f} | "
            f"{b['mb_per_s']:.1f} |" for b in builds]
  lines += ["", f"## Read (about {args.seconds:g} s each)", "", "| read | items in split | examples/s |",
            "|---|---|---|"]
  lines += [f"| {r['read']} | {r['items']:,} | {r['per_s']:,.0f} |" for r in rows]
  (RESULTS / "data_throughput.md").write_text("\n".join(lines) + "\n")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
