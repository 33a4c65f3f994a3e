"""Our side of the peer comparison: the project's real train step (Trainer) for the peer-matched Hourglass.

    .venv/bin/python benchmarks/peer/ours_worker.py SEQ_LEN BATCH [DTYPE]
"""

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(ROOT / ".jax_cache"))
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "peer"))

from hourglass_jax.runtime import host_memory  # noqa: E402

# As hourglass-train's --host_malloc does, before the backend starts (peer_compare.py --host_malloc).
HOST_MALLOC_KEPT = host_memory.configure(os.environ.get("HOURGLASS_HOST_MALLOC", "auto"))

from benchmarks.models import PEER_WIDE, bench_config  # noqa: E402
from benchmarks.steps import StepRunner  # noqa: E402
from worker_protocol import serve  # noqa: E402

# The peer has no dropout and no weight decay; everything else is configs/default.py's Hourglass.
PEER_MATCHED = dict(dropout=0.0)


def main():
  seq_len, batch = int(sys.argv[1]), int(sys.argv[2])
  dtype = sys.argv[3] if len(sys.argv) > 3 else "float32"
  shape = PEER_WIDE if os.environ.get("HOURGLASS_PEER_SHAPE") == "wide" else {}
  runner = StepRunner(bench_config("hourglass", seq_len, batch, dtype, **PEER_MATCHED, **shape))
  cfg = runner.cfg.model
  serve(runner, dict(impl="hourglass_jax", params=runner.facts["params"], model_flops=runner.facts["model_flops"],
                     xla_flops=runner.facts["xla_flops"], compile_s=runner.facts["compile_s"],
                     host_malloc_kept=HOST_MALLOC_KEPT,
                     config=f"{cfg.hierarchy} d{cfg.d_model} h{cfg.num_heads} ff{cfg.d_ff} {cfg.shorten}/"
                            f"{cfg.upsample} {cfg.position} dropout {cfg.dropout} {cfg.dtype}"))


if __name__ == "__main__":
  main()
