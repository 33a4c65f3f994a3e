"""The TFDS datasets this project trains on (`data.name`), with what preparing each one needs."""

import dataclasses

from hourglass_jax import paths

# Here rather than in enwik8.py so that reading the table does not import TFDS.
ENWIK8_URL, ENWIK8_ARCHIVE = "http://mattmahoney.net/dc/enwik8.zip", "enwik8.zip"


@dataclasses.dataclass(frozen=True)
class DatasetSpec:
  name: str                              # data.name, also the TFDS name
  kind: str                              # 'text' (one byte stream per split) | 'image' (one sequence per image)
  needs: str                             # what `hourglass-data prepare` needs, for messages
  automatic: bool = False                # built offline on first use, no prepare step
  image_shape: tuple[int, int, int] | None = None
  manual_files: tuple[tuple[str, str], ...] = ()  # (file name, where to get it) that --manual_dir must hold
  downloadable: bool = False             # prepare can fetch manual_files itself when online


def _imagenet(side: int) -> DatasetSpec:
  size = f"{side}x{side}"
  where = IMAGENET_URL.format(size)
  return DatasetSpec(f"downsampled_imagenet/{size}", "image", f"train_{size}.tar and valid_{size}.tar in --manual_dir "
                     f"(from {where})", image_shape=(side, side, 3),
                     manual_files=((f"train_{size}.tar", where), (f"valid_{size}.tar", where)))


CIFAR_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz"
IMAGENET_URL = "https://image-net.org/download-images (Downsampled ImageNet, {0}; an account is needed)"
DATASETS = {spec.name: spec for spec in (
    DatasetSpec("stdlib_text", "text", "nothing: the Python standard library's sources", automatic=True),
    DatasetSpec("enwik8", "text", f"{ENWIK8_ARCHIVE} from {ENWIK8_URL}: downloaded when online, else in --manual_dir",
                manual_files=((ENWIK8_ARCHIVE, ENWIK8_URL),), downloadable=True),
    DatasetSpec("text_files", "text", "--manual_dir=FILE_OR_FOLDER naming the text to use"),
    DatasetSpec("digits", "image", "scikit-learn (it ships the 8x8 digits)", automatic=True, image_shape=(8, 8, 1)),
    DatasetSpec("cifar10", "image", f"cifar-10-binary.tar.gz from {CIFAR_URL}: downloaded when online, else in "
                "--manual_dir", image_shape=(32, 32, 3), manual_files=(("cifar-10-binary.tar.gz", CIFAR_URL),),
                downloadable=True),
    _imagenet(32),
    _imagenet(64),
)}


def get(name: str) -> DatasetSpec:
  if name not in DATASETS:
    raise ValueError(f"no TFDS dataset named {name!r} here; choose one of {', '.join(DATASETS)}.")
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
