"""Typed config sections: a frozen dataclass declares a section's settings once (name, type, default, one-line
doc); `of(section)` reads a ConfigDict (or mapping) section as that dataclass, the declared default for a key it
lacks, so no read site restates a default; `defaults()` is the ConfigDict section base_config builds."""

import dataclasses
from typing import Any, Mapping


@dataclasses.dataclass(frozen=True, kw_only=True)
class Section:
  """Base of the typed sections (data.settings.DataSettings, train.settings.TrainSettings, CheckpointSettings)."""

  @classmethod
  def of(cls, section: "Mapping[str, Any] | Section"):
    """The section as `cls`; keys it does not declare are left to train/checks.py's known-keys check."""
    if isinstance(section, cls):
      return section
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{key: value for key, value in dict(section.items()).items() if key in names})

  @classmethod
  def defaults(cls) -> dict[str, Any]:
    return dataclasses.asdict(cls())
