"""The peer's side: lucidrains' hourglass-transformer-pytorch (pip package, in .venv-peer), trained with the same
step as ours: forward, cross-entropy, backward, global-norm clipping at 1.0, Adam(0.9, 0.98, eps 1e-9).

    .venv-peer/bin/python benchmarks/peer/peer_worker.py SEQ_LEN BATCH [THREADS]
"""

import os
import pathlib
import sys

import torch
import torch.nn.functional as F
from hourglass_transformer_pytorch import HourglassTransformerLM

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from worker_protocol import serve  # noqa: E402

# Closest to configs/default.py's Hourglass (2@1 4@3 2@1, d 128, 4 heads, ff 512, attention resampling with
# avg pooling and repeat): the peer's ff is 4 x d and its head size d / heads when dim_head = 32.
SHAPES = {  # HOURGLASS_PEER_SHAPE picks one; ours_worker.py builds the same model
    "default": dict(num_tokens=256, dim=128, depth=(2, 4, 2), shorten_factor=3, heads=4, dim_head=32,
                    attn_resampling=True, updown_sample_type="naive"),
    "wide": dict(num_tokens=256, dim=512, depth=(4, 2, 4), shorten_factor=4, heads=8, dim_head=64,
                 attn_resampling=False, updown_sample_type="naive"),
}
PEER = SHAPES[os.environ.get("HOURGLASS_PEER_SHAPE", "default")]


def forward_backward_flops(model, tokens) -> int | None:
  """Forward + backward FLOPs of one step, counted by torch's FlopCounterMode (matmuls and attention)."""
  try:
    from torch.utils.flop_counter import FlopCounterMode
  except ImportError:
    return None
  counter = FlopCounterMode(display=False)
  with counter:
    logits = model(tokens[:, :-1])
    F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:]).backward()
  model.zero_grad(set_to_none=True)
  return counter.get_total_flops()


def main():
  seq_len, batch = int(sys.argv[1]), int(sys.argv[2])
  torch.set_num_threads(int(sys.argv[3]) if len(sys.argv) > 3 else torch.get_num_threads())
  torch.manual_seed(0)
  model = HourglassTransformerLM(max_seq_len=seq_len, **PEER)
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.9, 0.98), eps=1e-9)
  tokens = torch.randint(0, 256, (batch, seq_len + 1))
  flops = forward_backward_flops(model, tokens)

  def step():
    optimizer.zero_grad(set_to_none=True)
    logits = model(tokens[:, :-1])
    loss = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:])
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    return loss.item()  # synchronous on CPU; .item() keeps it so on any device

  serve(step, dict(impl="hourglass-transformer-pytorch", torch=torch.__version__, threads=torch.get_num_threads(),
                   params=sum(p.numel() for p in model.parameters()), torch_flops=flops,
                   config=f"depth {PEER['depth']} shorten {PEER['shorten_factor']} d{PEER['dim']} h{PEER['heads']} "
                          f"attn_resampling {PEER['attn_resampling']} {PEER['updown_sample_type']} float32"))


if __name__ == "__main__":
  main()
