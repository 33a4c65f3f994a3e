"""`--help_config`: every `--config.SECTION.FIELD` of a config with its value and one-line doc, the docs read from
the settings classes' own declarations (hourglass_jax.runtime.settings.declarations), never restated here."""

import dataclasses
import inspect
import re
import shlex

import ml_collections

from hourglass_jax.config.train_settings import CheckpointSettings, TrainSettings
from hourglass_jax.data.batches.settings import DataSettings
from hourglass_jax.model.config import ModelConfig
from hourglass_jax.runtime.settings import declarations
from hourglass_jax.runtime.sharding import MeshSettings

# Each section of a config and the class that declares its settings.
SECTIONS = {"model": ModelConfig, "data": DataSettings, "train": TrainSettings, "mesh": MeshSettings,
            "checkpoint": CheckpointSettings}
_CONSTANT = re.compile(r"\b[A-Z][A-Z0-9_]{2,}\b")


def section_docs(section: str) -> dict[str, str]:
  """{field: doc} of a section's settings in declaration order, a constant a doc names (KINDS, DTYPES...) spelt out
  as its choices."""
  cls = SECTIONS[section]
  return {name: _CONSTANT.sub(lambda m, owner=owner: _choices(m.group(), owner, cls), doc)
          for name, (owner, doc) in declarations(cls).items()}


def _choices(constant: str, *classes) -> str:
  """'a | b | c' for a tuple of strings named `constant` in the module of one of `classes`, else `constant`."""
  for cls in classes:
    value = getattr(inspect.getmodule(cls), constant, None) if cls is not None else None
    if isinstance(value, tuple) and value and all(isinstance(v, str) for v in value):
      return " | ".join(value)
  return constant


def _shown(value) -> str:
  """A value as it would be typed after --config.S.F= (a string with control characters as Python writes it)."""
  if isinstance(value, str):
    return shlex.quote(value) if value.isprintable() else repr(value)
  if isinstance(value, (tuple, list)):
    return repr(tuple(value))
  return repr(value)


def listing(cfg: ml_collections.ConfigDict, title: str) -> str:
  """Every setting of `cfg` as `--config.SECTION.FIELD=VALUE  doc`, section by section in declaration order; a key
  no settings class declares (a config file's own addition) is listed with its value and no doc."""
  lines = [f"The settings of {title}, each a flag --config.SECTION.FIELD=VALUE (its value here, then what it "
           "means):", ""]
  for section in [*(s for s in SECTIONS if s in cfg), *(s for s in cfg.keys() if s not in SECTIONS)]:
    values = cfg[section]
    if not isinstance(values, ml_collections.ConfigDict):
      lines += [f"--config.{section}={_shown(values)}", ""]
      continue
    docs = section_docs(section) if section in SECTIONS else {}
    names = [*(n for n in docs if n in values), *(n for n in values.keys() if n not in docs)]
    entries = [(f"--config.{section}.{name}={_shown(values[name])}", docs.get(name, "")) for name in names]
    width = min(max(len(flag) for flag, _ in entries), 48)
    lines.append(f"{section}:")
    lines += [f"  {flag:<{width}}  {doc}".rstrip() if len(flag) <= width else f"  {flag}\n  {'':<{width}}  {doc}"
              for flag, doc in entries]
    lines.append("")
  return "\n".join(line.rstrip() for line in "\n".join(lines).splitlines()).rstrip() + "\n"


def documented_fields(section: str) -> tuple[str, ...]:
  """The config keys a section's settings class declares (not what a section resolves itself, such as data.spec)."""
  return tuple(f.name for f in dataclasses.fields(SECTIONS[section]) if f.init)
