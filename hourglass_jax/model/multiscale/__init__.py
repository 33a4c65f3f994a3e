"""The multi-scale models of Subramanian et al. 2020: the notation (scales.py), causal resampling between scales
(resampling.py), attention whose head groups read different scales (attention.py), the top-down and bottom-up
bodies (topdown_bottomup.py) and retina (retina.py)."""

from hourglass_jax.model.multiscale.retina import Retina, check_windows_fit
from hourglass_jax.model.multiscale.scales import MultiScale, parse_multiscale
from hourglass_jax.model.multiscale.topdown_bottomup import BottomUp, TopDown

__all__ = ["BottomUp", "MultiScale", "Retina", "TopDown", "check_windows_fit", "parse_multiscale"]
