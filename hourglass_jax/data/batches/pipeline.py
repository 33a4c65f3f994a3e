"""grain pipelines, the last step of the data flow: batches of any source (sources.py), as shuffled, repeating
training batches with a checkpointable position, and eval batches.

Global batch s holds examples [s*B, (s+1)*B) of one seeded shuffled stream, whatever the process count: each
process reads only its block of rows [start, stop), so 1 process and N processes see the same global batches.
"""

import grain
import numpy as np

_READ = grain.ReadOptions(num_threads=2, prefetch_buffer_size=4)


def _check_rows(global_batch: int, rows: tuple[int, int]) -> int:
  start, stop = rows
  local = stop - start
  if local <= 0 or global_batch % local or start % local:
    raise ValueError(f"process rows {rows} do not tile a global batch of {global_batch}.")
  return local


def train_iterator(source, seed: int, global_batch: int, rows: tuple[int, int]) -> grain.DatasetIterator:
  """Endless iterator of this process's rows of each global batch; `get_state()` / `set_state()` resume it."""
  local = _check_rows(global_batch, rows)
  dataset = grain.MapDataset.source(source).shuffle(seed=seed).repeat(None)
  dataset = dataset.batch(local, drop_remainder=True)
  dataset = dataset.slice(slice(rows[0] // local, None, global_batch // local))
  return iter(dataset.to_iter_dataset(_READ))


def num_eval_batches(source, global_batch: int, max_batches: int) -> int:
  """Batches covering the whole source (the last one padded), or `max_batches` if that is fewer (and > 0)."""
  total = -(-len(source) // global_batch)
  return min(total, max_batches) if max_batches > 0 else total


def eval_iterator(source, global_batch: int, rows: tuple[int, int], max_batches: int = 0):
  """This process's rows of consecutive eval batches: (tokens int32[b, L+1], weights float32[b, L]). A source with
  a `weights(i)` method (eval_windows.ScoredWindows) says which predictions count; otherwise all do. Padding rows
  past the end of the source repeat its last window with weight 0: they score nothing, and what a model measures of
  its input (a dynamic level's boundary rate) stays that of real text."""
  _check_rows(global_batch, rows)
  start, stop = rows
  size, width = len(source), len(source[0])
  weigh = getattr(source, "weights", lambda i: np.ones(width - 1, np.float32))

  def local_batch(b: int):
    index = np.arange(b * global_batch + start, b * global_batch + stop)
    tokens = np.stack([source[min(i, size - 1)] for i in index])
    weights = np.stack([weigh(i) if i < size else np.zeros(width - 1, np.float32) for i in index])
    return tokens, weights

  batches = grain.MapDataset.range(num_eval_batches(source, global_batch, max_batches)).map(local_batch)
  return iter(batches.to_iter_dataset(_READ))
