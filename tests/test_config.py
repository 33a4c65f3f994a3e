import ml_collections
import pytest

from hourglass_jax.model import ModelConfig, build_model
from tests.helpers import SMALL


@pytest.mark.parametrize("overrides, field, allowed", [
    (dict(kind="transformer"), "model.kind='transformer'", "hourglass, vanilla"),
    (dict(shorten="max"), "model.shorten='max'", "attention_avg"),
    (dict(upsample="conv"), "model.upsample='conv'", "attention_repeat"),
    (dict(position="absolute"), "model.position='absolute'", "rope, relative"),
    (dict(dtype="float64"), "model.dtype='float64'", "bfloat16"),
    (dict(attention_impl="flash"), "model.attention_impl='flash'", "splash"),
    (dict(vocab_size=1), "model.vocab_size=1", ">= 2"),
    (dict(d_model=30), "model.d_model=30 is not divisible by model.num_heads=4", "multiple of num_heads"),
    (dict(num_heads=0), "model.num_heads=0", ">= 1"),
    (dict(d_ff=2.5), "model.d_ff=2.5", "integer"),
    (dict(dropout=1.0), "model.dropout=1.0", "[0, 1)"),
    (dict(d_model=36, num_heads=4), "head size", "even"),
    (dict(hierarchy="2@1 4@3"), "model.hierarchy='2@1 4@3'", "odd number"),
    (dict(kind="vanilla", hierarchy="2@1 4@3 2@1"), "kind='vanilla'", "'8@1'"),
    (dict(kind="hourglass", hierarchy="4@1"), "no shortened level", "kind='vanilla'"),
    (dict(attention_impl="cudnn", dropout=0.1), "model.attention_impl='cudnn'", "dropout=0"),
    (dict(attention_impl="splash", position="relative"), "model.attention_impl='splash'", "position='rope'"),
])
def test_bad_fields_raise_naming_field_value_and_choices(overrides, field, allowed):
  values = dict(SMALL, kind="hourglass", hierarchy="1@1 2@3 1@1")
  values.update(overrides)
  with pytest.raises(ValueError) as error:
    ModelConfig(**values)
  assert field in str(error.value)
  assert allowed in str(error.value)


def test_unknown_key_in_config_dict_is_rejected_with_known_keys():
  cfg = ml_collections.ConfigDict(dict(SMALL, hierarchy="1@1 2@3 1@1", hiearchy="typo"))
  with pytest.raises(ValueError, match=r"unknown field\(s\) \['hiearchy'\].*'hierarchy'"):
    build_model(cfg)


def test_build_model_validates_before_tracing():
  cfg = ml_collections.ConfigDict(dict(SMALL, hierarchy="1@1 2@3 2@3 1@1"))
  with pytest.raises(ValueError, match="model.hierarchy"):
    build_model(cfg)  # raised here: no init, no jit
