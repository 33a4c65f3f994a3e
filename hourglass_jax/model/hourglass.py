"""The Hourglass body: a recursion of levels (pre layers -> shift -> shorten -> inner -> upsample -> post layers)."""

import flax.linen as nn

from hourglass_jax.model.config import ModelConfig
from hourglass_jax.model.layers import DecoderStack
from hourglass_jax.model.resampling import Shorten, Upsample, shift_right


class HourglassLevel(nn.Module):
  """Level `level` of the parsed hierarchy; the center level is a plain decoder stack (a vanilla model)."""
  cfg: ModelConfig
  level: int = 0

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool):
    hierarchy = self.cfg.parsed_hierarchy
    num_pre, factor = hierarchy.levels[self.level]
    if self.level == hierarchy.depth:
      return DecoderStack(self.cfg, num_pre, factor, name="layers")(x_BxLxD, deterministic)
    k = hierarchy.relative_factor(self.level)
    x_BxLxD = DecoderStack(self.cfg, num_pre, factor, name="pre")(x_BxLxD, deterministic)
    h0_BxLxD = shift_right(x_BxLxD, k - 1)
    z_BxLkxD = Shorten(self.cfg, k, factor, name="shorten")(h0_BxLxD, deterministic)
    z_BxLkxD = HourglassLevel(self.cfg, self.level + 1, name="inner")(z_BxLkxD, deterministic)
    y_BxLxD = Upsample(self.cfg, k, factor, name="upsample")(z_BxLkxD, x_BxLxD, deterministic)
    num_post = hierarchy.post_layers[self.level]
    return DecoderStack(self.cfg, num_post, factor, name="post")(y_BxLxD, deterministic)
