"""Block attention for backends without a fused kernel: an online softmax over a static block plan.

Queries and keys are cut into blocks. The static mask decides at trace time which (query block, key block) pairs
are computed: hidden pairs never, the others under their mask slice (an all-True block for fully visible ones, so
every round has one shape; the select fuses into the exp). Causal attention does about half the work of the square.
Each q block i needs the key blocks K_i (partial ones first); the q blocks are packed into G "lanes" of about equal
work (causal: block i with block n-1-i), and round r computes the r-th pair of every lane as one batched matmul,
then updates those rows' running max, sum and accumulator (float32). All rounds have one shape, so they run as a
`lax.scan`: compile time does not grow with the length. Memory is O(L x block): the backward (a custom VJP)
recomputes each round from the saved log-sum-exp.

Shapes as in ops/attention.py: q [B, T, N, H], k and v [B, S, N, H], mask [T, S] static numpy (True = may attend).
The bias is [B|1, N|1, T, S], or the relative form (pos [B|1, N|1, T, R], static int index [T, S]) meaning
bias[..., t, s] = pos[..., t, index[t, s]], gathered per block. Query rows the mask leaves empty return 0.
Probability dropout (after the softmax normalisation, as in the reference) draws one seed per pair from the rng
and hashes it with each element's counter into the pair's keep mask (_keep); dropout_keep_mask builds the same
mask in full for reference_attention.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from hourglass_jax.ops.dropout import mix32

BLOCK_Q = 128
BLOCK_K = 128
_MIN = float(np.finfo(np.float32).min)


@dataclasses.dataclass(frozen=True, eq=False)
class BlockPlan:
  """The static schedule: round r computes the pairs (q_blocks[r, g], k_blocks[r, g]) of the G lanes, under the
  mask block masks[mask_ids[r, g]] (0: all visible). Unused lane slots point at the spare q block `nq`."""
  t: int
  s: int
  bq: int
  bk: int
  nq: int
  nk: int
  q_blocks: np.ndarray  # [R, G]
  k_blocks: np.ndarray  # [R, G]
  mask_ids: np.ndarray  # [R, G]
  masks: np.ndarray  # [U, bq, bk]
  empty_rows: np.ndarray | None  # [nq * bq] True where a query row may see no key
  num_pairs: int


def block_sizes(t: int, s: int, block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> tuple[int, int]:
  """The block sizes used for lengths (t, s): as many blocks as the requested sizes need, each as small as that
  count allows (T 682 with 128: 6 blocks of 114, not 128 with 86 rows of padding)."""
  return -(-t // -(-t // block_q)), -(-s // -(-s // block_k))


def _padded_mask(mask_TxS, t, s, bq, bk):
  """[tp, sp]: padded keys hidden; padded query rows copy the last real row (so they change no pair's kind)."""
  m = np.zeros((-(-t // bq) * bq, -(-s // bk) * bk), bool)
  m[:t, :s] = True if mask_TxS is None else np.asarray(mask_TxS, bool)
  m[t:] = m[t - 1]
  return m


def _pack(counts) -> list[list[int]]:
  """q blocks -> lanes (first-fit decreasing); the capacity that minimises rounds x lanes, then rounds."""
  order = sorted((i for i in range(len(counts)) if counts[i]), key=lambda i: -counts[i])
  best = None
  for cap in range(max(counts), 2 * max(counts) + 1):
    lanes, loads = [], []
    for i in order:
      g = next((g for g, load in enumerate(loads) if load + counts[i] <= cap), len(lanes))
      if g == len(lanes):
        lanes.append([])
        loads.append(0)
      lanes[g].append(i)
      loads[g] += counts[i]
    cost = (max(loads) * len(lanes), max(loads))
    if best is None or cost < best[0]:
      best = cost, lanes
  return best[1]


def make_plan(mask_TxS, t: int, s: int, block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> BlockPlan:
  """Block schedule of a static mask (None = all visible)."""
  if mask_TxS is not None and np.shape(mask_TxS) != (t, s):
    raise ValueError(f"mask shape {np.shape(mask_TxS)} does not match (T, S) = {(t, s)}.")
  bq, bk = block_sizes(t, s, block_q, block_k)
  m = _padded_mask(mask_TxS, t, s, bq, bk)
  nq, nk = m.shape[0] // bq, m.shape[1] // bk
  blocks_QxKxBqxBk = m.reshape(nq, bq, nk, bk).transpose(0, 2, 1, 3)
  any_QxK, all_QxK = blocks_QxKxBqxBk.any((2, 3)), blocks_QxKxBqxBk.all((2, 3))
  needed = [np.concatenate([np.flatnonzero(any_QxK[i] & ~all_QxK[i]), np.flatnonzero(all_QxK[i])])
            for i in range(nq)]
  lanes = _pack([len(k) for k in needed]) if any(len(k) for k in needed) else [[]]
  pairs = [[(i, j) for i in lane for j in needed[i]] for lane in lanes]
  rounds = max(1, max(map(len, pairs)))
  q_blocks, k_blocks = np.full((rounds, len(lanes)), nq), np.zeros((rounds, len(lanes)), int)
  for g, lane in enumerate(pairs):
    for r, (i, j) in enumerate(lane):
      q_blocks[r, g], k_blocks[r, g] = i, j
  partial = [(i, j) for i in range(nq) for j in needed[i] if not all_QxK[i, j]]
  masks, inverse = np.unique(np.stack([np.ones((bq, bk), bool), np.zeros((bq, bk), bool)]
                                      + [blocks_QxKxBqxBk[i, j] for i, j in partial]), axis=0,
                             return_inverse=True)
  masks = masks[::-1]  # the all-True block first: 0 = full
  inverse = len(masks) - 1 - inverse.reshape(-1)
  mask_id = np.full((nq + 1, nk), inverse[1])  # the spare q block: all hidden
  mask_id[:nq][all_QxK] = inverse[0]
  for (i, j), u in zip(partial, inverse[2:]):
    mask_id[i, j] = u
  empty = ~m.any(1)
  return BlockPlan(t, s, bq, bk, nq, nk, q_blocks, k_blocks, mask_id[q_blocks, k_blocks], masks,
                   empty if empty.any() else None, sum(map(len, needed)))


def _blocks(x_BxLxNxH, n, blk, spare=False):
  """[B, L, N, H] -> [n (+1 zero block), B, N, blk, H], zero-padded."""
  b, length, heads, h = x_BxLxNxH.shape
  x = jnp.pad(x_BxLxNxH, ((0, 0), (0, (n + spare) * blk - length), (0, 0), (0, 0)))
  return x.reshape(b, n + spare, blk, heads, h).transpose(1, 0, 3, 2, 4)


def _unblocks(x_nxBxNxBlkxH, length):
  n, b, heads, blk, h = x_nxBxNxBlkxH.shape
  return x_nxBxNxBlkxH.transpose(1, 0, 3, 2, 4).reshape(b, n * blk, heads, h)[:, :length]


def materialize_bias(bias):
  """A bias array [B|1, N|1, T, S] from either form (the relative form through a gather)."""
  if not isinstance(bias, tuple):
    return bias
  pos, index_TxS = bias
  return jnp.take_along_axis(pos, jnp.asarray(index_TxS)[None, None], axis=-1)


def relative_bias(pos_BxNxTxR, index_TxS, scale: float = 1.0):
  """The relative form (scale * pos, index) of a Transformer-XL position term: what layers.relative_position_terms
  builds before its gather, e.g. `relative_bias(pos_BxNxTxR, index_TxS, cfg.head_dim ** -0.5)`."""
  return pos_BxNxTxR * scale if scale != 1.0 else pos_BxNxTxR, np.asarray(index_TxS)


def block_attention_pays(mask_TxS, t: int, s: int, block_q: int = BLOCK_Q, block_k: int = BLOCK_K) -> bool:
  """Whether block_attention beats XLA's attention (and the einsum reference with dropout) on a 2-core CPU, from
  results/block_attention.json: when its plan skips at least a fifth of the T x S square and T x S >= 256 x 256.
  Unmasked, it only saves memory (0.7x to 1.1x the time). On an H100 it also won at the enwik8 step's shapes
  (results/gpu_throughput.json)."""
  if mask_TxS is not None and not isinstance(mask_TxS, np.ndarray):
    return False
  plan = make_plan(mask_TxS, t, s, block_q, block_k)
  return t * s >= 256 * 256 and plan.num_pairs * plan.bq * plan.bk <= 0.8 * t * s


def _bias_source(plan: BlockPlan, bias):
  """(source, table or None): bias blocks [(nq + 1) * nk, b, n, bq, bk] for an array, or for the relative form
  pos [b, n, T * R] and the flat index of pair p's block into it, patterns[pattern_of[p]] + offset_of[p]: blocks
  that differ by a constant (Transformer-XL's Toeplitz index) share a pattern, so no [T, S] table is stored."""
  tp, sp = (plan.nq + 1) * plan.bq, plan.nk * plan.bk
  if not isinstance(bias, tuple):
    if bias.shape[-2:] != (plan.t, plan.s):
      raise ValueError(f"bias {bias.shape} does not match (T, S) = {(plan.t, plan.s)}.")
    x = jnp.pad(bias, ((0, 0), (0, 0), (0, tp - plan.t), (0, sp - plan.s)))
    x = x.reshape(*bias.shape[:2], plan.nq + 1, plan.bq, plan.nk, plan.bk).transpose(2, 4, 0, 1, 3, 5)
    return x.reshape(-1, *x.shape[2:]), None
  pos, index_TxS = bias
  index_TxS = np.asarray(index_TxS)
  if index_TxS.shape != (plan.t, plan.s) or pos.shape[-2] != plan.t:
    raise ValueError(f"bias {pos.shape} / index {index_TxS.shape} do not match (T, S) = {(plan.t, plan.s)}.")
  r = pos.shape[-1]
  flat = np.zeros((tp, sp), np.int32)
  flat[:plan.t, :plan.s] = np.arange(plan.t)[:, None] * r + index_TxS
  blocks = flat.reshape(plan.nq + 1, plan.bq, plan.nk, plan.bk).transpose(0, 2, 1, 3).reshape(-1, plan.bq, plan.bk)
  offset_of, pattern_of, patterns = blocks[:, 0, 0].copy(), np.zeros(len(blocks), np.int32), {}
  for p in np.unique(plan.q_blocks * plan.nk + plan.k_blocks):
    pattern = blocks[p] - offset_of[p]
    pattern_of[p] = patterns.setdefault(pattern.tobytes(), (len(patterns), pattern))[0]
  table = np.stack([pattern for _, pattern in patterns.values()]), pattern_of, offset_of
  return pos.reshape(*pos.shape[:2], plan.t * r), table


def _pair_seeds(rng, nq: int, nk: int):
  """One uint32 seed per (query block, key block) pair, pair (i, j) at index i * nk + j of a single draw of
  (nq + 1) * nk words (the spare q block's pairs included), so every caller sees the same seed for a pair."""
  return jax.random.bits(rng, ((nq + 1) * nk,), jnp.uint32)


def _keep(seeds_P, rate, b, n, bq, bk):
  """Dropout keep masks [P, B, N, bq, bk] from one seed per pair: 32-bit words mix32(mix32(counter) ^ seed) of
  the element counter, each word's two 16-bit halves below round(65536 (1 - rate)), so P(keep) is within 2^-17
  of 1 - rate. A counter hash costs a tenth of threefry's bits on CPU (where they were a fifth of the attention
  step with dropout); hashing the counter before the seed enters keeps two pairs' masks from being shifted
  copies of each other, as an additive seed would make them."""
  threshold = np.uint32(round(65536 * (1.0 - rate)))
  words = -(-bk // 2)
  if b * n * bq * words >= 2 ** 32:
    raise ValueError(f"block attention dropout: batch {b} x heads {n} x a {bq} x {bk} block exceeds the 2^32 "
                     "counter of its keep mask; use a smaller batch per attention call.")
  counter = jnp.arange(b * n * bq * words, dtype=jnp.uint32).reshape(1, b, n, bq, words)
  bits = mix32(mix32(counter) ^ jnp.asarray(seeds_P, jnp.uint32).reshape(-1, 1, 1, 1, 1))
  halves = jax.lax.bitcast_convert_type(bits, jnp.uint16).reshape(*bits.shape[:4], 2 * words)[..., :bk]
  return halves.astype(jnp.uint32) < threshold


def dropout_keep_mask(rng, rate: float, b: int, n: int, t: int, s: int, block_q: int = BLOCK_Q,
                      block_k: int = BLOCK_K):
  """The full [B, N, T, S] keep mask that block_attention draws block-wise (pair (i, j) has id i * nk + j) from
  the same rng and block sizes; give it to reference_attention(dropout_mask=...) to reproduce its dropout."""
  bq, bk = block_sizes(t, s, block_q, block_k)
  nq, nk = -(-t // bq), -(-s // bk)
  keep = _keep(_pair_seeds(rng, nq, nk)[:nq * nk], rate, b, n, bq, bk).reshape(nq, nk, b, n, bq, bk)
  return keep.transpose(2, 3, 0, 4, 1, 5).reshape(b, n, nq * bq, nk * bk)[:, :, :t, :s]


def block_attention(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, mask_TxS=None, bias=None, *, dropout_rate: float = 0.0,
                    dropout_rng=None, block_q: int = BLOCK_Q, block_k: int = BLOCK_K):
  """Attention (see module docstring) computing only the blocks a static mask leaves visible; blocks of at most
  block_q queries and block_k keys (block_sizes); output in v's dtype, statistics in float32."""
  b, t, heads, _ = q_BxTxNxH.shape
  s = k_BxSxNxH.shape[1]
  if mask_TxS is not None and not isinstance(mask_TxS, np.ndarray):
    raise TypeError("block_attention needs a static numpy mask (its block plan is made at trace time).")
  plan = make_plan(mask_TxS, t, s, block_q, block_k)
  rate = float(dropout_rate) if dropout_rate > 0.0 and dropout_rng is not None else 0.0
  source, table = _bias_source(plan, bias) if bias is not None else (None, None)
  seeds = _pair_seeds(dropout_rng, plan.nq, plan.nk)[plan.q_blocks * plan.nk + plan.k_blocks] if rate else None
  return _attention_fn(plan, table, rate, (b, heads))(q_BxTxNxH, k_BxSxNxH, v_BxSxNxH, source, seeds)


class _Rounds:
  """The static parts of one block attention (the plan, the relative-bias table, the dropout rate, (B, N)) and
  what its forward and backward scans compute per round. It holds numpy only: a jax array made here would be a
  tracer of the caller's trace (e.g. flax's nn.scan) leaking into the backward."""

  def __init__(self, plan: BlockPlan, table, rate: float, bn):
    self.plan, self.table, self.rate, self.bn = plan, table, rate, bn
    self.pair_ids = plan.q_blocks * plan.nk + plan.k_blocks
    self.visible = None if plan.empty_rows is None else np.append(~plan.empty_rows, np.zeros(plan.bq, bool))

  def rounds(self, seeds):
    plan = self.plan
    return plan.q_blocks, plan.k_blocks, plan.mask_ids, self.pair_ids, seeds

  def flat_index(self, pid):
    patterns, pattern_of, offset_of = self.table
    return jnp.asarray(patterns)[jnp.asarray(pattern_of)[pid]] + jnp.asarray(offset_of)[pid][:, None, None]

  def logits(self, x, q5, k5, source):
    """Scaled, biased, masked logits [G, B, N, bq, bk] of one round."""
    qi, kj, mid, pid, _ = x
    s = jnp.einsum("gbnqh,gbnkh->gbnqk", q5[qi], k5[kj], preferred_element_type=jnp.float32)
    s = s * (q5.shape[-1] ** -0.5)
    if source is not None and self.table is None:
      s = s + source[pid].astype(jnp.float32)
    elif source is not None:
      s = s + jnp.moveaxis(jnp.take(source, self.flat_index(pid), axis=-1), 2, 0).astype(jnp.float32)
    return jnp.where(jnp.asarray(self.plan.masks)[mid][:, None, None], s, _MIN)

  def keep_scale(self, seeds_G):
    plan = self.plan
    return _keep(seeds_G, self.rate, *self.bn, plan.bq, plan.bk) / (1.0 - self.rate) if self.rate else None

  def blocks(self, q, k, v):
    plan = self.plan
    return _blocks(q, plan.nq, plan.bq, spare=True), _blocks(k, plan.nk, plan.bk), _blocks(v, plan.nk, plan.bk)

  def forward(self, q, k, v, source, seeds):
    """(out, log-sum-exp per query): an online softmax over the visible blocks, round by round."""
    plan, bn = self.plan, self.bn
    q5, k5, v5 = self.blocks(q, k, v)

    def step(carry, x):
      m, l, acc = carry
      qi, kj, _, pid, seed = x
      s = self.logits(x, q5, k5, source)
      m_old = m[qi]
      m_new = jnp.maximum(m_old, s.max(-1))
      p = jnp.exp(s - m_new[..., None])
      alpha = jnp.exp(m_old - m_new)
      z = self.keep_scale(seed)
      pv = jnp.einsum("gbnqk,gbnkh->gbnqh", (p if z is None else p * z).astype(v.dtype), v5[kj],
                      preferred_element_type=jnp.float32)
      return (m.at[qi].set(m_new), l.at[qi].set(alpha * l[qi] + p.sum(-1)),
              acc.at[qi].set(alpha[..., None] * acc[qi] + pv)), None

    init = (jnp.full((plan.nq + 1, *bn, plan.bq), _MIN, jnp.float32),
            jnp.zeros((plan.nq + 1, *bn, plan.bq), jnp.float32),
            jnp.zeros((plan.nq + 1, *bn, plan.bq, v.shape[-1]), jnp.float32))
    (m, l, acc), _ = jax.lax.scan(step, init, self.rounds(seeds))
    l = jnp.where(l > 0, l, 1.0)
    out = acc / l[..., None]
    if self.visible is not None:
      out = jnp.where(self.visible.reshape(plan.nq + 1, 1, 1, plan.bq, 1), out, 0.0)
    return _unblocks(out, plan.t).astype(v.dtype), m + jnp.log(l)

  def backward(self, res, d_out):
    """Gradients of (q, k, v, bias source, seeds) from the forward's residuals, round by round."""
    plan, table = self.plan, self.table
    q, k, v, source, seeds, out, lse = res
    scale = q.shape[-1] ** -0.5
    q5, k5, v5 = self.blocks(q, k, v)
    do5 = _blocks(d_out, plan.nq, plan.bq, spare=True)
    if self.visible is not None:
      do5 = jnp.where(self.visible.reshape(plan.nq + 1, 1, 1, plan.bq, 1), do5, 0)
    delta = jnp.sum(do5.astype(jnp.float32) * _blocks(out, plan.nq, plan.bq, spare=True).astype(jnp.float32), -1)
    sum_axes = () if source is None else tuple(a + 1 for a in (0, 1) if source.shape[a + (table is None)] == 1)
    # dK and dV are accumulated transposed, [.., H, bk] = Q^T dS and dO^T P: a contraction over the queries as
    # "gbnqk,gbnqh->gbnkh" has a transposed left operand, which XLA:CPU leaves to a batched Eigen dot at a third of
    # YNNPACK's rate (benchmarks/results/block_attention_bwd_layout.json). Q and dO are transposed once here, dK and
    # dV once after the scan.
    q5_t, do5_t = jnp.swapaxes(q5, -1, -2), jnp.swapaxes(do5, -1, -2)

    def step(carry, x):
      dq, dk_t, dv_t, dsource = carry
      qi, kj, _, pid, seed = x
      p = jnp.exp(self.logits(x, q5, k5, source) - lse[qi][..., None])
      z = self.keep_scale(seed)
      dv_t_blk = jnp.einsum("gbnhq,gbnqk->gbnhk", do5_t[qi], (p if z is None else p * z).astype(v.dtype),
                            preferred_element_type=jnp.float32)
      dp = jnp.einsum("gbnqh,gbnkh->gbnqk", do5[qi], v5[kj], preferred_element_type=jnp.float32)
      ds = p * ((dp if z is None else dp * z) - delta[qi][..., None])
      dsc = (ds * scale).astype(q.dtype)
      dq = dq.at[qi].add(jnp.einsum("gbnqk,gbnkh->gbnqh", dsc, k5[kj], preferred_element_type=jnp.float32))
      dk_t = dk_t.at[kj].add(jnp.einsum("gbnhq,gbnqk->gbnhk", q5_t[qi], dsc, preferred_element_type=jnp.float32))
      if dsource is not None:
        ds_src = ds.sum(sum_axes, keepdims=True) if sum_axes else ds
        if table is None:
          dsource = dsource.at[pid].add(ds_src)
        else:
          dsource = dsource.at[..., self.flat_index(pid)].add(jnp.moveaxis(ds_src, 0, 2))
      return (dq, dk_t, dv_t.at[kj].add(dv_t_blk), dsource), None

    zeros_t = lambda x5: jnp.zeros((*x5.shape[:3], x5.shape[4], x5.shape[3]), jnp.float32)
    init = (jnp.zeros(q5.shape, jnp.float32), zeros_t(k5), zeros_t(v5),
            None if source is None else jnp.zeros(source.shape, jnp.float32))
    (dq, dk_t, dv_t, dsource), _ = jax.lax.scan(step, init, self.rounds(seeds))
    dk, dv = jnp.swapaxes(dk_t, -1, -2), jnp.swapaxes(dv_t, -1, -2)
    return (_unblocks(dq, plan.t).astype(q.dtype), _unblocks(dk, plan.s).astype(k.dtype),
            _unblocks(dv, plan.s).astype(v.dtype), None if source is None else dsource.astype(source.dtype), None)


def _attention_fn(plan: BlockPlan, table, rate, bn):
  """A custom-VJP attention (q, k, v, bias source, dropout seeds [R, G] or None) closed over the static plan,
  relative-bias table and dropout rate (`_Rounds`)."""
  rounds = _Rounds(plan, table, rate, bn)

  @jax.custom_vjp
  def attend(q, k, v, source, seeds):
    return rounds.forward(q, k, v, source, seeds)[0]

  def attend_fwd(q, k, v, source, seeds):
    out, lse = rounds.forward(q, k, v, source, seeds)
    return out, (q, k, v, source, seeds, out, lse)

  attend.defvjp(attend_fwd, rounds.backward)
  return attend
