"""An offline corpus every machine has: the Python standard library's own source files, as bytes. The raw input
of the `stdlib_text` builder (text_files.py); tests and benchmarks read the bytes directly."""

import pathlib
import sysconfig

import numpy as np


def stdlib_source_files() -> list[pathlib.Path]:
  """Sorted top-level `.py` files of the running interpreter's standard library."""
  root = pathlib.Path(sysconfig.get_paths()["stdlib"])
  files = sorted(p for p in root.glob("*.py") if p.is_file())
  if not files:
    raise FileNotFoundError(f"no Python standard-library sources found under {root}; this interpreter ships "
                            "without them, so pass a text file corpus instead.")
  return files


def stdlib_bytes(max_bytes: int | None = None) -> np.ndarray:
  """The standard library sources concatenated (file order sorted), as uint8, optionally truncated."""
  chunks, total = [], 0
  for path in stdlib_source_files():
    data = path.read_bytes()
    chunks.append(data)
    total += len(data)
    if max_bytes is not None and total >= max_bytes:
      break
  corpus = np.frombuffer(b"".join(chunks), np.uint8)
  return corpus[:max_bytes] if max_bytes is not None else corpus
