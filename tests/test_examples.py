"""The examples outside the package run, learn, and use only the public layer API."""

import ast
import importlib.util
import pathlib

import pytest

EXAMPLES = pathlib.Path(__file__).resolve().parents[1] / "examples"


def load_example(name: str):
  spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def package_imports(path: pathlib.Path) -> set[str]:
  modules = set()
  for node in ast.walk(ast.parse(path.read_text())):
    if isinstance(node, ast.ImportFrom) and node.module:
      modules.add(node.module)
    elif isinstance(node, ast.Import):
      modules.update(alias.name for alias in node.names)
  return {m for m in modules if m.split(".")[0] == "hourglass_jax"}


def test_examples_import_only_the_public_layer_api():
  for path in sorted(EXAMPLES.glob("*.py")):
    assert package_imports(path) <= {"hourglass_jax.nn"}, path.name


@pytest.mark.slow
def test_digits_patches_example_trains_an_hourglass_body_over_patches(capsys):
  """A model the package does not ship (next-patch regression on 2x2 digit patches) learns with optax: the
  held-out error ends well below predicting the mean patch."""
  result = load_example("digits_patches").main(["--steps", "120"])
  losses = result["losses"]
  assert len(losses) == 120 and sum(losses[-10:]) < 0.7 * sum(losses[:10])
  assert result["held_out"] < 0.7 * result["baseline"]
  assert "held-out mse" in capsys.readouterr().out
