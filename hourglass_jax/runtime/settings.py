"""Typed config sections: a frozen dataclass declares a section's settings once (name, type, default, one-line
doc); `of(section)` reads a ConfigDict (or mapping) section as that dataclass, the declared default for a key it
lacks, so no read site restates a default; `defaults()` is the ConfigDict section base_config builds. A section
checks itself when built (`check`: every field's type, then the section's own ranges and choices), so a bad
setting is refused in one line naming it before anything is compiled, wherever the section is first read.
`field_docs(cls)` reads each field's one-line doc from its declaration (`name: type = default  # doc`)."""

import ast
import dataclasses
import functools
import inspect
import io
import math
import textwrap
import tokenize
from typing import Any, ClassVar, Mapping

_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Section:
  """Base of the typed sections (data.batches.settings.DataSettings, config.train_settings.TrainSettings,
  CheckpointSettings)."""
  NAME: ClassVar[str] = ""  # the ConfigDict section's name, for messages ('train')

  @classmethod
  def of(cls, section: "Mapping[str, Any] | Section"):
    """The section as `cls` (checked); keys it does not declare are left to train/checks.py's known-keys check."""
    if isinstance(section, cls):
      return section
    names = cls.setting_names()
    return cls(**{key: value for key, value in dict(section.items()).items() if key in names})

  @classmethod
  def setting_names(cls) -> tuple[str, ...]:
    """The section's settings (its ConfigDict keys): the fields given to it, not those it resolves (init=False)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.init)

  @classmethod
  def defaults(cls) -> dict[str, Any]:
    section = cls()
    return {name: getattr(section, name) for name in cls.setting_names()}

  def __post_init__(self):
    self.check()

  def check(self) -> None:
    """Raises ValueError naming the first setting of a wrong type (a bool is not a number, an int is a float; a
    float must be finite), then whatever the section's `check_values` refuses."""
    for field in (f for f in dataclasses.fields(self) if f.init):
      value, kind = getattr(self, field.name), field.type
      fits = (isinstance(value, bool) if kind is bool else
              isinstance(value, kind) and not isinstance(value, bool) if kind in (int, str) else
              isinstance(value, (int, float)) and not isinstance(value, bool) if kind is float else True)
      if not fits:
        raise ValueError(f"{self.NAME}.{field.name}={value!r} is a {type(value).__name__}; it must be "
                         f"{_KINDS.get(kind, kind)}.")
      if kind is float and not math.isfinite(value):
        raise ValueError(f"{self.NAME}.{field.name}={value!r} must be a finite number.")
    self.check_values()

  def check_values(self) -> None:
    """The section's ranges and choices (its subclass's); its fields' types are already checked."""

  def at_least(self, minimum, *names: str, why: str = "") -> None:
    """Each of `names` must be >= `minimum` (`why`: a parenthesis saying what the bound is for)."""
    for name in names:
      value = getattr(self, name)
      if value < minimum:
        kind = "an integer " if isinstance(value, int) else ""
        raise ValueError(f"{self.NAME}.{name}={value!r} must be {kind}>= {minimum}{f' ({why})' if why else ''}.")

  def below(self, maximum, name: str, why: str) -> None:
    """`name` must be < `maximum`."""
    value = getattr(self, name)
    if value >= maximum:
      raise ValueError(f"{self.NAME}.{name}={value!r} must be < {maximum} ({why}).")

  def positive(self, *names: str) -> None:
    for name in names:
      if getattr(self, name) <= 0:
        raise ValueError(f"{self.NAME}.{name}={getattr(self, name)!r} must be > 0.")

  def fraction(self, name: str, what: str, *, closed: bool) -> None:
    """`name` in [0, 1] (`closed`) or [0, 1)."""
    value = getattr(self, name)
    if not (0 <= value <= 1 if closed else 0 <= value < 1):
      raise ValueError(f"{self.NAME}.{name}={value!r} must be in [0, 1{']' if closed else ')'} ({what}).")

  def choice(self, name: str, allowed) -> None:
    if getattr(self, name) not in allowed:
      raise ValueError(f"{self.NAME}.{name}={getattr(self, name)!r}; choose one of {', '.join(allowed)}.")


def field_docs(cls: type) -> dict[str, str]:
  """{field: its one-line doc} of the dataclass `cls`: the comment on the line that declares the field, else the
  comment lines right above it, read from the source of the class that declares it (`cls`, its bases, and
  `cls.settings_sources` for a class made from other classes' fields); '' where the source is not available."""
  return {name: doc for name, (_, doc) in declarations(cls).items()}


def declarations(cls: type) -> dict[str, tuple[type | None, str]]:
  """{field: (the class whose body declares it, its doc)} of the dataclass `cls` (None, '' where not found)."""
  found: dict[str, tuple[type, str]] = {}
  for owner in _declaring_classes(cls):
    for name, doc in _declared_docs(owner).items():
      found.setdefault(name, (owner, doc))
  return {f.name: found.get(f.name, (None, "")) for f in dataclasses.fields(cls)}


def _declaring_classes(cls: type) -> list[type]:
  classes = list(cls.__mro__)
  for source in getattr(cls, "settings_sources", ()):
    classes += [c for c in source.__mro__ if c not in classes]
  return classes


@functools.cache
def _declared_docs(owner: type) -> dict[str, str]:
  """{name: doc} of the annotated fields `owner`'s own class body declares (nothing for a class without source)."""
  try:
    source = textwrap.dedent(inspect.getsource(owner))
  except (OSError, TypeError):
    return {}
  body = ast.parse(source).body
  if not body or not isinstance(body[0], ast.ClassDef):
    return {}
  comments: dict[int, str] = {}  # line -> the comment on it
  code_lines: set[int] = set()  # lines holding code
  for token in tokenize.generate_tokens(io.StringIO(source).readline):
    if token.type == tokenize.COMMENT:
      comments[token.start[0]] = token.string.lstrip("#").strip()
    elif token.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER):
      code_lines.update(range(token.start[0], token.end[0] + 1))
  docs = {}
  for node in body[0].body:
    if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
      continue
    trailing = [comments[line] for line in range(node.lineno, node.end_lineno + 1) if line in comments]
    above, line = [], node.lineno - 1
    while line in comments and line not in code_lines:  # a comment block of its own right above the field
      above.insert(0, comments[line])
      line -= 1
    docs[node.target.id] = " ".join(trailing or above)
  return docs
