"""Where a training step's time goes: one enwik8-shaped decoder block (d 512, 8 heads, ff 2048), forward +
backward, in variants timed interleaved against a plain matmul of the same FLOPs.

    .venv/bin/python benchmarks/profile_block.py [--seq_len 2048] [--variants base,nodrop,...] [--rounds 5]

Variants (each the real `DecoderBlock`): base = float32, dropout 0.2 (threefry keys, the einsum attention that
dropout needs); nodrop = dropout 0 (jax.nn.dot_product_attention); rbg = dropout 0.2 with 'rbg' dropout keys;
bf16 / bf16_rbg / bf16_nodrop = bfloat16 compute; noattn_drop = dropout 0.2 on the residual and FFN only (the
attention probabilities undropped, emulating a proposed model option); u8_drop = dropout 0.2 with the attention
mask drawn from 8-bit random bytes; ref_nodrop = dropout 0 through the einsum reference attention (the path that
dropout forces). MFU of each is its analytic FLOPs (3 x forward, attention as the full square) over the float32
matmul peak measured in the same rounds. `--dump DIR` writes XLA's optimized HLO of each variant.
Results: results/profile_block.json.
"""

import os
import pathlib

os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", str(pathlib.Path(__file__).resolve().parents[1] / ".jax_cache"))

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import sys  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

from benchmarks.common import append_result, interleave, loadavg, median  # noqa: E402
from benchmarks.matmul_peak import MatmulProbe  # noqa: E402
from hourglass_jax.model import ModelConfig  # noqa: E402
from hourglass_jax.model import layers  # noqa: E402
from hourglass_jax.model.layers import DecoderBlock  # noqa: E402
from hourglass_jax.ops import attention  # noqa: E402

ENWIK8 = ModelConfig(d_model=512, num_heads=8, d_ff=2048, hierarchy="1@1", kind="vanilla", dropout=0.2)
VARIANTS = {
    "base": (dict(), "threefry2x32"),
    "nodrop": (dict(dropout=0.0), "threefry2x32"),
    "rbg": (dict(), "rbg"),
    "bf16": (dict(dtype="bfloat16"), "threefry2x32"),
    "bf16_nodrop": (dict(dtype="bfloat16", dropout=0.0), "threefry2x32"),
    "bf16_rbg": (dict(dtype="bfloat16"), "rbg"),
    "unsafe_rbg": (dict(), "unsafe_rbg"),
    "noattn_drop": (dict(), "threefry2x32"),
    "bf16_noattn_drop": (dict(dtype="bfloat16"), "threefry2x32"),
    "u8_drop": (dict(), "threefry2x32"),
    "ref_nodrop": (dict(dropout=0.0, attention_impl="reference"), "threefry2x32"),
}
NO_ATTENTION_DROPOUT = ("noattn_drop", "bf16_noattn_drop")
BYTE_MASK = ("u8_drop",)


def _byte_mask_attention(q, k, v, mask=None, bias=None, *, dropout_rate=0.0, dropout_rng=None):
  """The proposed probability dropout: keep where an 8-bit random byte < round(256 (1 - rate)), a quarter of the
  random bits `jax.random.bernoulli` draws (it compares float32 uniforms); keep probability quantised to 1/256."""
  if not dropout_rate or dropout_rng is None:
    return _reference(q, k, v, mask, bias)
  scale = q.shape[-1] ** -0.5
  logits = jnp.einsum("btnh,bsnh->bnts", q, k, preferred_element_type=jnp.float32) * scale
  if bias is not None:
    logits = logits + bias.astype(jnp.float32)
  if mask is not None:
    logits = jnp.where(mask, logits, jnp.finfo(jnp.float32).min)
  probs = jax.nn.softmax(logits, axis=-1)
  threshold = round(256 * (1.0 - dropout_rate))
  keep = jax.random.bits(dropout_rng, probs.shape, jnp.uint8) < threshold
  probs = jnp.where(keep, probs * (256.0 / threshold), 0.0)
  return jnp.einsum("bnts,bsnh->btnh", probs.astype(v.dtype), v)


_reference = attention.reference_attention


def _without_probability_dropout(q, k, v, mask=None, bias=None, *, impl="auto", dropout_rate=0.0, dropout_rng=None):
  """The proposed attention: dropout on the residual and FFN only, so the fused (no-dropout) kernel applies."""
  return attention.dot_product_attention(q, k, v, mask, bias, impl=impl)


def block_flops(cfg: ModelConfig, length: int) -> float:
  d, f = cfg.d_model, cfg.d_ff
  forward = 2 * length * d * d * 4 + 2 * 2 * length * length * d + 2 * 2 * length * d * f
  return 3.0 * forward


class BlockStep:
  """Jitted forward + backward (grads of params and input) of one DecoderBlock on a fixed input."""

  def __init__(self, cfg: ModelConfig, length: int, key_impl: str, batch: int = 1, attention_dropout: bool = True,
               byte_mask: bool = False):
    self.block = DecoderBlock(cfg)
    x = jax.random.normal(jax.random.key(0), (batch, length, cfg.d_model), jnp.float32)
    self.params = self.block.init(jax.random.key(1), x, True)["params"]
    self.x, self.key = x, jax.random.key(2, impl=key_impl)
    deterministic = cfg.dropout == 0.0

    def loss(params, x, key):
      y = self.block.apply({"params": params}, x, deterministic, rngs={"dropout": key})
      return jnp.mean(y.astype(jnp.float32) ** 2)

    self.step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))
    original = layers.dot_product_attention
    layers.dot_product_attention = original if attention_dropout else _without_probability_dropout
    attention.reference_attention = _byte_mask_attention if byte_mask else _reference
    try:  # the patches matter only while tracing
      self.compiled = self.step.lower(self.params, self.x, self.key).compile()
    finally:
      layers.dot_product_attention, attention.reference_attention = original, _reference
    self.compiled(self.params, self.x, self.key)

  def __call__(self):
    jax.block_until_ready(self.compiled(self.params, self.x, self.key))


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--seq_len", type=int, default=2048)
  parser.add_argument("--variants", default=",".join(VARIANTS))
  parser.add_argument("--rounds", type=int, default=5)
  parser.add_argument("--budget_s", type=float, default=300)
  parser.add_argument("--dump", default="", help="folder for each variant's optimized HLO")
  parser.add_argument("--results", default="")
  args = parser.parse_args(argv)
  steps = {}
  for name in args.variants.split(","):
    overrides, key_impl = VARIANTS[name]
    steps[name] = BlockStep(dataclasses.replace(ENWIK8, **overrides), args.seq_len, key_impl,
                            attention_dropout=name not in NO_ATTENTION_DROPOUT, byte_mask=name in BYTE_MASK)
    print(f"compiled {name}, load {loadavg()[0]}", flush=True)
    if args.dump:
      path = pathlib.Path(args.dump) / f"{name}.hlo.txt"
      path.parent.mkdir(parents=True, exist_ok=True)
      path.write_text(steps[name].compiled.as_text())
  probe = MatmulProbe(1024, "float32")
  timed = interleave({"peak_float32": probe, **steps}, args.rounds, args.budget_s)
  flops = block_flops(ENWIK8, args.seq_len)
  base = median(timed["times"]["base"]) if "base" in steps else None
  rows = []
  print(f"\none block, L={args.seq_len}, {flops / 1e9:.1f} GFLOP per fwd+bwd; float32 matmul peak "
        f"{probe.best / 1e9:.1f} GFLOP/s (load {loadavg()})")
  for name in steps:
    t = median(timed["times"][name])
    row = dict(variant=name, step_s=t, mfu_vs_f32=flops / t / probe.best, speedup_vs_base=base / t if base else None,
               xla_flops=float(steps[name].compiled.cost_analysis()["flops"]))
    rows.append(row)
    print(f"{name:>12}: {t * 1e3:8.1f} ms  MFU {row['mfu_vs_f32']:6.1%}"
          + (f"  {row['speedup_vs_base']:.2f}x vs base" if base else ""))
  append_result("profile_block", dict(args=vars(args), peak_float32=probe.best, flops=flops, rows=rows,
                                      loads=timed["loads"]), pathlib.Path(args.results) if args.results else None)


if __name__ == "__main__":
  main()
