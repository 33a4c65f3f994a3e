"""The TFDS datasets this project trains on (`data.name`), with what preparing each one needs, and the splits they
all have. The bottom of the data flow: the builders, tfds_io, prepare and sources read this table; it imports no
TFDS, so reading it is cheap."""

import dataclasses

from hourglass_jax.runtime import paths

# The download places, here rather than in the builders so that reading the table does not import TFDS.
ENWIK8_URL, ENWIK8_ARCHIVE = "http://mattmahoney.net/dc/enwik8.zip", "enwik8.zip"
CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
IMAGENET_URL = "https://image-net.org/download-images (Downsampled ImageNet, {0}; an account is needed)"


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  name: str                              # data.name, also the TFDS name
  kind: str                              # 'text' (one byte stream per split) | 'image' (one sequence per image)
  needs: str                             # what `hourglass-data prepare` needs, for messages
  automatic: bool = False                # built offline on first use, no prepare step
  image_shape: tuple[int, int, int] | None = None
  manual_files: tuple[tuple[str, str], ...] = ()  # (file name, where to get it) that --manual_dir must hold
  downloadable: bool = False             # prepare can fetch manual_files itself when online
  about: str = ""                        # what the data is, in a sentence (the export's model card)
  hub_id: str | None = None              # the same data's Hugging Face Hub dataset id, where one exists

  @property
  def unit(self) -> str:
    """What a score is per: 'dim' (bits per dim, an image's channel value) or 'byte'."""
    return "dim" if self.kind == "image" else "byte"


def _imagenet(side: int) -> DatasetSpec:
  size = f"{side}x{side}"
  where = IMAGENET_URL.format(size)
  return DatasetSpec(f"downsampled_imagenet/{size}", "image", f"train_{size}.tar and valid_{size}.tar in --manual_dir "
                     f"(from {where})", image_shape=(side, side, 3),
                     manual_files=((f"train_{size}.tar", where), (f"valid_{size}.tar", where)),
                     about=f"Downsampled ImageNet at {size} pixels (van den Oord et al. 2016), 3 values per pixel.")


DATASETS = {spec.name: spec for spec in (
    DatasetSpec("stdlib_text", "text", "nothing: the Python standard library's sources", automatic=True,
                about="The Python standard library's own source files (Python code and its docstrings, mostly "
                "English), as raw bytes: the offline corpus every Python installation ships."),
    DatasetSpec("enwik8", "text", f"{ENWIK8_ARCHIVE} from {ENWIK8_URL}: downloaded when online, else in --manual_dir",
                manual_files=((ENWIK8_ARCHIVE, ENWIK8_URL),), downloadable=True,
                about="enwik8: the first 10^8 bytes of an English Wikipedia XML dump (the Hutter prize), as raw bytes.",
                hub_id="LTCB/enwik8"),
    DatasetSpec("text_files", "text", "--manual_dir=FILE_OR_FOLDER naming the text to use",
                about="Local text files, as raw bytes, split by document."),
    DatasetSpec("digits", "image", "scikit-learn (it ships the 8x8 digits)", automatic=True, image_shape=(8, 8, 1),
                about="scikit-learn's 1,797 handwritten digits, 8x8 pixels, grey levels 0..16 scaled to 0..255."),
    DatasetSpec("cifar10", "image", f"cifar-10-binary.tar.gz from {CIFAR_URL}: downloaded when online, else in "
                "--manual_dir", image_shape=(32, 32, 3), manual_files=(("cifar-10-binary.tar.gz", CIFAR_URL),),
                downloadable=True, about="CIFAR-10: 60,000 images of 32x32 pixels, 3 values per pixel.",
                hub_id="uoft-cs/cifar10"),
    _imagenet(32),
    _imagenet(64),
)}


# Sources read without TFDS: a data.name beside the TFDS datasets.
DIRECT = {spec.name: spec for spec in (
    DatasetSpec("text_file", "text", "nothing: data.path names a file, read as is",
                about="A local text file, as raw bytes."),
    DatasetSpec("synthetic", "synthetic", "nothing: random tokens",
                about="Random tokens (for benchmarks: nothing to learn).")
)}


def get(name: str) -> DatasetSpec:
  """The TFDS dataset `name` (hourglass-data prepare's and tfds_io's)."""
  if name not in DATASETS:
    raise ValueError(f"no TFDS dataset named {name!r} here; choose one of {', '.join(DATASETS)}.")
  return DATASETS[name]


def spec(name: str) -> DatasetSpec:
  """What a data.name is (its kind, image shape, what preparing it needs): a TFDS dataset or a source read directly.
  The run config looks it up once (data.batches.settings.DataSettings.spec); a card's recorded name is looked up
  here."""
  if name in DIRECT:
    return DIRECT[name]
  if name not in DATASETS:
    raise ValueError(f"data.name={name!r} is unknown; choose one of {', '.join((*DATASETS, *DIRECT))} "
                     "(e.g. --config.data.name=stdlib_text, the offline corpus).")
  return DATASETS[name]


def check_manual_files(spec: DatasetSpec, manual_dir) -> None:
  """Before any build: with --manual_dir, every file it needs must be there (no network is tried); without it, the
  dataset must be downloadable."""
  if not spec.manual_files:
    return
  if manual_dir is None:
    if not spec.downloadable:
      files = " and ".join(f for f, _ in spec.manual_files)
      raise FileNotFoundError(f"{spec.name} cannot be downloaded automatically: get {files} from "
                              f"{spec.manual_files[0][1]}, put them in a folder and run `hourglass-data prepare "
                              f"{spec.name} --manual_dir=FOLDER`.")
    return
  folder = paths.as_path(manual_dir)
  for file, url in spec.manual_files:
    if not (folder / file).is_file():
      raise FileNotFoundError(f"{spec.name}: {file} is not in the manual directory {folder}. Download {url} and "
                              f"put it at {folder / file}, then run `hourglass-data prepare {spec.name} "
                              f"--manual_dir={folder}`.")


SPLIT_NAMES = ("train", "validation", "test")  # what every builder here writes
SPLIT_ALIASES = {"valid": "validation"}  # the configs' spelling


def split_bounds(total: int) -> dict[str, tuple[int, int]]:
  """Ranges of train / validation / test over `total` bytes or images in order: the first 90%, the next 5%, the
  last 5% (enwik8's split; digits and text of fewer than 3 documents use it too)."""
  train, valid = total * 90 // 100, total * 95 // 100
  return dict(zip(SPLIT_NAMES, ((0, train), (train, valid), (valid, total))))
