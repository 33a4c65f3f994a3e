"""docs/layout.md is what scripts/layout.py makes of the tree: every module, with its own docstring's first
sentence, so the page cannot go stale."""

import pathlib

from scripts import layout


def test_the_layout_page_is_what_the_tree_makes():
  assert layout.PAGE.read_text() == layout.page(), "docs/layout.md is stale: run .venv/bin/python scripts/layout.py"


def test_every_module_of_the_package_has_a_row():
  text = layout.page()
  package = layout.ROOT / "hourglass_jax"
  for path in package.rglob("*.py"):
    if path.name != "__init__.py":
      assert f"## {path.parent.relative_to(layout.ROOT)}/" in text and f"| `{path.name}` |" in text, path


def test_a_sentence_ends_outside_brackets_and_code(tmp_path):
  module = tmp_path / "m.py"
  module.write_text('"""`tool-x`: does a (small. thing) with `a.b` well. Then more."""\n')
  assert layout.first_sentence(module) == "`tool-x`: does a (small. thing) with `a.b` well."
  module.write_text("x = 1\n")
  assert layout.first_sentence(pathlib.Path(module)) == "(no docstring)"
