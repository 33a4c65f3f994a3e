"""The Hourglass body: pre layers -> shorten (shift included) -> inner body -> upsample -> post layers, recursively."""

import flax.linen as nn

from hourglass_jax.model.hierarchy import parse_hierarchy
from hourglass_jax.model.layer_config import LayerOptions
from hourglass_jax.model.layers import DecoderStack, pad_to
from hourglass_jax.model.resampling import Shorten, Upsample


class Hourglass(LayerOptions):
  """x [B, L, D] -> y [B, L, D], causal: y[:, t] depends only on x[:, :t+1]. Any L (padded at the end inside).

  `hierarchy` is the level notation ('2@1 4@3 2@1': 2 layers at full resolution, 4 at 1/3, 2 back at full; a
  single '8@1' is a plain decoder stack); `shorten` and `upsample` pick the resampling methods (see `Shorten`,
  `Upsample`); `outer_factor` is the input stream's own shortening. Block settings: `LayerOptions`. Params: 'pre',
  'shorten', 'inner' (the next level, the same layout), 'upsample', 'post'; or 'layers' for a single level.
  """
  hierarchy: str = "2@1 4@3 2@1"
  shorten: str = "attention_avg"
  upsample: str = "attention_repeat"
  outer_factor: int = 1

  @nn.compact
  def __call__(self, x_BxLxD, deterministic: bool = True):
    hierarchy = parse_hierarchy(self.hierarchy)
    options = self.layer_config(x_BxLxD.shape[-1]).options()
    factor = self.outer_factor
    if not hierarchy.depth:
      return DecoderStack(num_layers=hierarchy.levels[0][0], factor=factor, **options, name="layers")(
          x_BxLxD, deterministic)
    length = x_BxLxD.shape[1]
    x_BxPxD = pad_to(x_BxLxD, hierarchy.total_factor)
    k = hierarchy.relative_factor(0)
    x_BxPxD = DecoderStack(num_layers=hierarchy.levels[0][0], factor=factor, **options, name="pre")(
        x_BxPxD, deterministic)
    z_BxQxD = Shorten(factor=k, method=self.shorten, outer_factor=factor, **options, name="shorten")(
        x_BxPxD, deterministic)
    z_BxQxD = Hourglass(hierarchy=str(hierarchy.inner()), shorten=self.shorten, upsample=self.upsample,
                        outer_factor=factor * k, **options, name="inner")(z_BxQxD, deterministic)
    y_BxPxD = Upsample(factor=k, method=self.upsample, outer_factor=factor, **options, name="upsample")(
        z_BxQxD, x_BxPxD, deterministic)
    y_BxPxD = DecoderStack(num_layers=hierarchy.post_layers[0], factor=factor, **options, name="post")(
        y_BxPxD, deterministic)
    return y_BxPxD[:, :length]
