import ast
import collections
import dataclasses
import importlib
import inspect
import pathlib
import pkgutil
import re

import flax.linen as nn
import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from hourglass_jax.config.train_settings import CheckpointSettings, TrainSettings
import hourglass_jax.model
from hourglass_jax.config.base import base_config
from hourglass_jax.data.batches.settings import DataSettings
from hourglass_jax.model import ModelConfig, build_model
from hourglass_jax.model.config import DYNAMIC_ONLY_FIELDS, config_section_fields
from hourglass_jax.model.draft_heads import DRAFT_HEAD_FIELDS
from tests.helpers import CONFIGS, SMALL


@pytest.mark.parametrize("overrides, field, allowed", [
    (dict(kind="transformer"), "model.kind='transformer'", "hourglass, vanilla"),
    (dict(shorten="max"), "model.shorten='max'", "attention_avg"),
    (dict(upsample="conv"), "model.upsample='conv'", "attention_repeat"),
    (dict(position="absolute"), "model.position='absolute'", "rope, relative"),
    (dict(dtype="float64"), "model.dtype='float64'", "bfloat16"),
    (dict(attention_impl="tpu_flash"), "model.attention_impl='tpu_flash'", "splash"),
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
    (dict(attention_impl="splash", attention_dropout=0.1), "model.attention_impl='splash'", "attention_dropout=0"),
    (dict(remat_policy="everything"), "model.remat_policy='everything'", "nothing_saveable, dots_saveable"),
    (dict(scan_unroll=-1), "model.scan_unroll=-1", "integer >= 0"),
    (dict(attention_impl="splash", position="relative"), "model.attention_impl='splash'", "position='rope'"),
    (dict(downsampler="max"), "model.downsampler='max'", "avg, conv"),
    (dict(upsampler="linear"), "model.upsampler='linear'", "repeat, transposed_conv"),
    (dict(kind="topdown", scales="16,5,1"), "model.scales='16,5,1'", "each an integer multiple of the next"),
    (dict(kind="topdown", scales="1,4,16"), "model.scales='1,4,16' does not end at 1", "coarse to fine"),
    (dict(kind="topdown", scales="4,4,1"), "model.scales='4,4,1'", "integer multiple"),
    (dict(kind="topdown", scales="4"), "model.scales='4' has a single scale", "'16,4,1'"),
    (dict(kind="topdown", scales="4;1"), "model.scales='4;1'", "comma-separated"),
    (dict(kind="topdown", scales="4,1", layers_per_scale="1,2,3"), "model.layers_per_scale='1,2,3' has 3 entries",
     "one integer >= 0 per scale"),
    (dict(kind="bottomup", scales="4,1", layers_per_scale="1,-1"), "model.layers_per_scale='1,-1'", "'2,2'"),
    (dict(kind="bottomup", scales="4,2,1", layers_per_scale="1,1,1"), "model.heads_per_scale=''",
     "one head count per scale summing to 4"),
    (dict(kind="retina", hierarchy="2@1", scales="2,1", retina_windows="0:2,2:8", heads_per_scale="1,1"),
     "model.heads_per_scale='1,1' sums to 2", "divide the model.num_heads=4 heads"),
    (dict(kind="retina", hierarchy="2@1 4@3 2@1", scales="2,1", retina_windows="0:2,2:8"), "kind='retina'", "'8@1'"),
    (dict(kind="retina", hierarchy="2@1", scales="2,1"), "model.retina_windows='' is empty", "'0:8,8:256,256:512'"),
    (dict(kind="retina", hierarchy="2@1", scales="4,2,1", heads_per_scale="1,1,2", retina_windows="0:2,1:6,6:12"),
     "window 1:6 overlaps the previous one", "without gaps or overlaps"),
    (dict(kind="retina", hierarchy="2@1", scales="4,2,1", heads_per_scale="1,1,2", retina_windows="0:2,3:6,6:12"),
     "window 3:6 leaves a gap", "without gaps or overlaps"),
    (dict(kind="retina", hierarchy="2@1", scales="4,2,1", heads_per_scale="1,1,2", retina_windows="1:2,2:6,6:12"),
     "window 1:2 leaves a gap", "tiling the context from 0"),
    (dict(kind="retina", hierarchy="2@1", scales="4,2,1", heads_per_scale="1,1,2", retina_windows="0:2,2:6"),
     "model.retina_windows='0:2,2:6' has 2 windows for 3 scales", "one 'a:b' window per scale"),
    (dict(kind="retina", hierarchy="2@1", scales="4,2,1", heads_per_scale="1,1,2", retina_windows="0:1,1:2,2:12"),
     "window 2:12 of the scale-4 heads starts 2 tokens back", "at least 3 back"),
    (dict(kind="retina", hierarchy="2@1", scales="2,1", retina_windows="0:2,8:4"), "'8:4' is not a window",
     "0 <= a < b"),
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


def test_multiscale_fields_are_checked_only_for_the_kinds_that_use_them():
  ModelConfig(**dict(SMALL, kind="hourglass", hierarchy="1@1 2@3 1@1", scales="bad", retina_windows="bad"))
  cfg = ModelConfig(**dict(SMALL, kind="topdown", hierarchy="4@1", scales="16,4,1", layers_per_scale="1,2,3",
                           heads_per_scale="bad", retina_windows="bad"))
  assert cfg.parsed_scales.factors == (16, 4, 1) and cfg.parsed_scales.layers == (1, 2, 3)
  assert cfg.pad_multiple == 16
  cfg = ModelConfig(**dict(SMALL, kind="retina", hierarchy="3@1", scales="16,4,1", heads_per_scale="1,1,2",
                           retina_windows="0:8,8:256,256:512"))
  assert cfg.parsed_scales.windows == ((256, 512), (8, 256), (0, 8))  # aligned with the scales, coarse to fine
  assert cfg.parsed_scales.heads == (1, 1, 2)


@pytest.mark.parametrize("field", list(config_section_fields()))
def test_every_model_field_can_be_overridden_from_the_command_line(field):
  """The model section is ModelConfig's fields: each one takes a --config.model override (a valid value other than
  its default) and reaches the validated ModelConfig."""
  other = {"kind": "vanilla", "hierarchy": "1@1 2@2 1@1", "shorten": "linear", "upsample": "linear", "position": "relative",
           "dtype": "bfloat16", "attention_impl": "xla", "scales": "16,4,1", "layers_per_scale": "1,1,1",
           "heads_per_scale": "2,2,4", "downsampler": "conv", "upsampler": "repeat", "retina_windows": "0:4,4:8,8:16",
           "attention_dropout": "0.2", "dropout": "0.1", "layer_norm_eps": "1e-5", "rope_base": "500.0",
           "vocab_size": "300", "d_model": "256", "num_heads": "4", "d_ff": "1024", "scan_unroll": "2",
           "boundaries": "whitespace", "boundary_bytes": " .", "boundary_run_bytes": " ",
           "segment_capacity": "2.0", "gumbel_temperature": "1.0",
           "boundary_loss_weight": "0.5", "segment_pooling": "linear",
           "gumbel_evaluation": "sample", "draft_heads": "3", "draft_heads_from": "short",
           "draft_loss_weight": "0.5", "remat_policy": "dots_saveable"}[field]
  argv = ["prog", f"--config={CONFIGS / 'tiny.py'}", f"--config.model.{field}={other}"]
  values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=values, sys_argv=argv)
  values(argv)
  model_section = values.config.model
  if field == "kind":
    model_section.hierarchy = "3@1"
  if field in DYNAMIC_ONLY_FIELDS:  # refused on a fixed model, where they would be ignored
    model_section.update(shorten="dynamic", upsample="repeat")
  if field in DRAFT_HEAD_FIELDS:  # heads and their loss weight go together (model/draft_heads.py)
    model_section.update(**{"draft_heads": 2, "draft_loss_weight": 0.3, field: model_section[field]})
  parsed = getattr(ModelConfig.from_dict(model_section), field)
  assert str(parsed) == other or parsed == type(parsed)(other), (field, parsed)


def test_typed_sections_are_the_base_config_and_no_read_site_restates_a_default():
  """data, train and checkpoint are declared once, as dataclasses: base_config's sections are their defaults, a
  section missing keys reads the declared defaults, and no module reads a section key with `.get(key, default)`."""
  base = base_config()
  for name, cls in (("data", DataSettings), ("train", TrainSettings), ("checkpoint", CheckpointSettings)):
    assert base[name].to_dict() == cls.defaults()
    assert cls.of(base[name]) == cls()
  assert DataSettings.of(ml_collections.ConfigDict(dict(name="text_file", seq_len=64))) == DataSettings(
      name="text_file", seq_len=64)
  keys = {f.name for cls in (DataSettings, TrainSettings, CheckpointSettings) for f in dataclasses.fields(cls)}
  pattern = re.compile(r"(\.(data|train|checkpoint)|data_cfg|train_cfg)\.get\(\s*['\"](" + "|".join(sorted(keys))
                       + r")['\"]\s*,")
  package = pathlib.Path(__file__).resolve().parents[1] / "hourglass_jax"
  restated = [f"{path.relative_to(package.parent)}:{number}" for path in sorted(package.rglob("*.py"))
              for number, line in enumerate(path.read_text().splitlines(), 1)
              if pattern.search(line)]
  assert not restated, f"section keys read with a default of their own: {restated}"


SETTINGS = {f.name for f in dataclasses.fields(ModelConfig)}


def default(cls, name):
  field = getattr(cls, "__dataclass_fields__", {}).get(name)
  return vars(cls).get(name, dataclasses.MISSING) if field is None else field.default


def declarations(classes) -> dict[str, list[str]]:
  """The classes among `classes` that declare each ModelConfig field with a default. Not declarations: the fields of
  a class made by `settings_class` / `module_fields` (its other defaults are its declared `settings_overrides`), and
  a field without a default (a module's input, such as a block's parsed `scales`)."""
  declared = collections.defaultdict(list)
  for cls in sorted(classes, key=lambda cls: (len(cls.__mro__), cls.__qualname__)):
    for name in SETTINGS & set(vars(cls).get("__annotations__", {})):
      if "settings_overrides" not in vars(cls) and default(cls, name) is not dataclasses.MISSING:
        declared[name].append(cls.__qualname__)
  return declared


def test_every_model_setting_is_declared_once():
  """A setting's one declaration (name, type, default, doc) lives in the settings class of the modules that read it;
  ModelConfig inherits it, the nn modules take it through `module_fields` with their small defaults as named
  overrides. A second declaration fails, as a planted one shows."""
  classes = {cls for info in pkgutil.walk_packages(hourglass_jax.model.__path__, "hourglass_jax.model.")
             for _, cls in inspect.getmembers(importlib.import_module(info.name), inspect.isclass)}
  declared = declarations(classes)
  assert set(declared) == SETTINGS
  assert {name: owners for name, owners in declared.items() if len(owners) > 1} == {}
  assert declared["scales"] == ["MultiScaleSettings"] and declared["vocab_size"] == ["VocabSettings"]

  class Planted(nn.Module):  # restates a multi-scale setting
    scales: str = "16,4,1"

  assert declarations(classes | {Planted})["scales"] == ["MultiScaleSettings", Planted.__qualname__]


SECTIONS = ("model", "data", "train", "mesh", "checkpoint")
# The flag layer: the config skeleton, presets and --help_config (config/), and the entry points that own --config.
FLAG_LAYER = ("config/", "cli/main.py")
# Where a ConfigDict may still be named: the flag layer, export_config (an export folder's config for the readers)
# and train_and_evaluate's entry, which makes the RunConfig of a ConfigDict a Python caller passes.
CONFIG_DICT_HOMES = (*FLAG_LAYER, "train/checkpointing/model_source.py", "train/loop/loop.py")


def _config_holder(node) -> bool:
  """`cfg`, `self.cfg`, `_CONFIG.value`, `config`...: an expression that names a config dict."""
  if isinstance(node, ast.Attribute) and node.attr == "value":
    node = node.value
  name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
  return "cfg" in name.lower() or "config" in name.lower()


def raw_section_reads(source: str) -> list[int]:
  """Lines reading a section of a config dict: `cfg.data...`, `trainer.cfg.train...`, `cfg["mesh"]`."""
  lines = []
  for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Attribute) and node.attr in SECTIONS and _config_holder(node.value):
      lines.append(node.lineno)
    elif (isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and node.slice.value in SECTIONS
          and isinstance(node.value, ast.Name) and "cfg" in node.value.id.lower()):
      lines.append(node.lineno)
  return lines


def test_no_part_past_the_entry_points_reads_the_config_dict():
  """The ConfigDict lives in configs/*.py and the flag layer: past the entry points every part reads the RunConfig
  or its own section, never `cfg.<section>.<key>`, and only the flag layer (and the two entries that turn a
  caller's ConfigDict into a RunConfig) imports ml_collections. The scan sees a planted read."""
  package = pathlib.Path(__file__).resolve().parents[1] / "hourglass_jax"
  found, importers = [], []
  for path in sorted(package.rglob("*.py")):
    name = path.relative_to(package).as_posix()
    source = path.read_text()
    if not name.startswith(FLAG_LAYER):
      found += [f"{name}:{line}" for line in raw_section_reads(source)]
    if not name.startswith(CONFIG_DICT_HOMES) and re.search(r"^\s*(import|from) ml_collections", source, re.M):
      importers.append(name)
  assert not found, f"raw config-dict section reads outside the flag layer: {found}"
  assert not importers, f"modules past the entry points that import ml_collections: {importers}"
  assert raw_section_reads("def f(trainer):\n  return trainer.cfg.data.seq_len, cfg['mesh']\n") == [2, 2]
  assert raw_section_reads("def f(run):\n  return run.data.seq_len, run.mesh.rules\n") == []


def test_the_run_config_is_made_once_typed_frozen_and_checked():
  """run_config makes every section its typed class (the data section with its dataset resolved, the mesh rules
  checked), is frozen, hands a RunConfig back as it is, and refuses a bad setting in one line; the trainer refuses a
  ConfigDict, naming the function that makes a RunConfig."""
  from hourglass_jax.config import RunConfig, run_config
  from hourglass_jax.runtime.sharding import MeshSettings
  from hourglass_jax.train.compiled.trainer import Trainer
  from tests.helpers import tiny_config

  cfg = tiny_config(data=dict(name="digits", seq_len=64), mesh=dict(rules=[["batch", ["data", "fsdp"]]]))
  run = run_config(cfg)
  assert isinstance(run, RunConfig) and run_config(run) is run
  assert [type(getattr(run, s)) for s in SECTIONS] == [ModelConfig, DataSettings, TrainSettings, MeshSettings,
                                                       CheckpointSettings]
  assert run.data.spec.kind == "image" and run.data.spec.image_shape == (8, 8, 1) and run.data.spec.unit == "dim"
  assert run.mesh.rules == (("batch", ("data", "fsdp")),)
  with pytest.raises(dataclasses.FrozenInstanceError):
    run.data.seq_len = 128
  for section, change, message in (
      ("data", dict(name="wikitext"), r"^data.name='wikitext' is unknown; choose one of stdlib_text, "),
      ("mesh", dict(rules=[["tokens", None]]), r"^mesh.rules names logical axis 'tokens'; the model uses batch, "),
      ("mesh", dict(fsdp=0), r"^mesh.data=-1, mesh.fsdp=0, mesh.tensor=1: each size must be a positive integer"),
      ("train", dict(grad_accum_steps=3), r"^data.batch_size=8 is not divisible by train.grad_accum_steps=3"),
      ("train", dict(remat=True), r"^train.remat is not a known setting")):
    with pytest.raises(ValueError, match=message):
      run_config(tiny_config(**{section: change}))
  with pytest.raises(TypeError, match=r"Trainer takes a RunConfig, not a ConfigDict: make one with "
                                      r"hourglass_jax.config.run_config\(cfg\)"):
    Trainer(cfg, None)


def test_each_setting_of_the_run_config_is_declared_in_one_section():
  """No setting name is declared by two sections (remat_policy was the model's and the train section's)."""
  from hourglass_jax.runtime.sharding import MeshSettings

  owners = collections.defaultdict(list)
  for section, cls in zip(SECTIONS, (ModelConfig, DataSettings, TrainSettings, MeshSettings, CheckpointSettings)):
    for field in dataclasses.fields(cls):
      owners[field.name].append(section)
  assert {name: where for name, where in owners.items() if len(where) > 1} == {}
