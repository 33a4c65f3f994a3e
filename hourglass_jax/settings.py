"""Typed config sections: a frozen dataclass declares a section's settings once (name, type, default, one-line
doc); `of(section)` reads a ConfigDict (or mapping) section as that dataclass, the declared default for a key it
lacks, so no read site restates a default; `defaults()` is the ConfigDict section base_config builds.
`field_docs(cls)` reads each field's one-line doc from its declaration (`name: type = default  # doc`)."""

import ast
import dataclasses
import functools
import inspect
import io
import textwrap
import tokenize
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
