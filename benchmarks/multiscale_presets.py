"""Parameters, FLOPs and memory of one training step for each configs/bookcorpus.py preset (compile only).

Each step is loss + grad + an Adam update, jitted and compiled ahead of time (nothing runs); FLOPs and bytes
come from XLA's cost and memory analyses for the backend JAX runs on. Memory = temp + argument + output bytes
(no donation). Usage:

    .venv/bin/python benchmarks/multiscale_presets.py [--batch 8] [--seq_len 512] [--presets vanilla,retina_16_4_1]
"""

import argparse
import importlib.util
import json
import pathlib
import time

import jax
import jax.numpy as jnp
import optax

from hourglass_jax.model import ModelConfig, build_model
from hourglass_jax.model import counting

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def load_presets():
  spec = importlib.util.spec_from_file_location("bookcorpus", ROOT / "configs" / "bookcorpus.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def measure(model_cfg: ModelConfig, batch: int, seq_len: int) -> dict:
  """Analytic and traced parameter counts; XLA FLOPs and bytes of one compiled training step."""
  model = build_model(model_cfg)
  tokens = jax.ShapeDtypeStruct((batch, seq_len + 1), jnp.int32)
  params = jax.eval_shape(lambda: model.init(jax.random.key(0), jnp.zeros((1, seq_len), jnp.int32))["params"])
  params = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), params)  # unbox logical axes
  analytic = counting.total_params(model_cfg)
  traced = sum(x.size for x in jax.tree.leaves(params))
  if analytic != traced:
    raise AssertionError(f"analytic params {analytic} != initialised {traced} for {model_cfg}")
  optimizer = optax.adam(3e-4, b1=0.9, b2=0.98, eps=1e-9)

  def train_step(params, opt_state, tokens_BxL1):
    def loss_fn(p):
      logits = model.apply({"params": p}, tokens_BxL1[:, :-1])
      return optax.softmax_cross_entropy_with_integer_labels(logits, tokens_BxL1[:, 1:]).mean()
    loss, grads = jax.value_and_grad(loss_fn)(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  opt_state = jax.eval_shape(optimizer.init, params)
  start = time.perf_counter()
  compiled = jax.jit(train_step).lower(params, opt_state, tokens).compile()
  compile_s = time.perf_counter() - start
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, list) else cost
  memory = compiled.memory_analysis()
  temp, arg, out = memory.temp_size_in_bytes, memory.argument_size_in_bytes, memory.output_size_in_bytes
  return dict(params=traced, xla_flops=float(cost["flops"]),
              analytic_flops=3 * batch * counting.forward_flops(model_cfg, seq_len),
              temp_bytes=temp, argument_bytes=arg, output_bytes=out, memory_bytes=temp + arg + out,
              compile_s=round(compile_s, 1))


def markdown(rows: list[dict], batch: int, seq_len: int, backend: str) -> str:
  lines = [f"Training step (loss + grad + Adam), batch {batch} x {seq_len} tokens, XLA on {backend}; "
           "memory = temp + argument + output bytes, no donation. Analytic FLOPs = 3 x forward matmul FLOPs.", "",
           "| preset | kind | params | XLA TFLOPs/step | analytic TFLOPs/step | memory GiB | temp GiB |",
           "|---|---|---:|---:|---:|---:|---:|"]
  for r in rows:
    gib = lambda key: f"{r[key] / 2**30:.2f}"
    lines.append(f"| {r['preset']} | {r['kind']} | {r['params']:,} | {r['xla_flops'] / 1e12:.2f} | "
                 f"{r['analytic_flops'] / 1e12:.2f} | {gib('memory_bytes')} | {gib('temp_bytes')} |")
  return "\n".join(lines) + "\n"


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--seq_len", type=int, default=512)
  parser.add_argument("--presets", default="", help="comma-separated; default: every full-size preset")
  args = parser.parse_args()
  presets = load_presets()
  names = args.presets.split(",") if args.presets else list(presets.PRESETS)
  rows = []
  for name in names:
    model_cfg = ModelConfig.from_dict(presets.get_config(name).model)
    row = dict(preset=name, kind=model_cfg.kind, **measure(model_cfg, args.batch, args.seq_len))
    rows.append(row)
    print(f"{name:<22}{row['params']:>13,} params {row['xla_flops'] / 1e12:8.2f} TFLOPs "
          f"{row['memory_bytes'] / 2**30:7.2f} GiB  (compiled in {row['compile_s']} s)", flush=True)
  backend = f"{jax.default_backend()} ({jax.devices()[0].device_kind})"
  table = markdown(rows, args.batch, args.seq_len, backend)
  print("\n" + table)
  RESULTS.mkdir(parents=True, exist_ok=True)
  (RESULTS / "multiscale_presets.json").write_text(json.dumps(
      dict(batch=args.batch, seq_len=args.seq_len, backend=backend, jax=jax.__version__, rows=rows), indent=2) + "\n")
  (RESULTS / "multiscale_presets.md").write_text(table)


if __name__ == "__main__":
  main()
