import pytest

from hourglass_jax.model.hourglass.hierarchy import parse_hierarchy


@pytest.mark.parametrize("text, levels, post", [
    ("5@1 24@3 5@1", ((5, 1), (24, 3)), (5,)),
    ("3@1 12@3 3@1", ((3, 1), (12, 3)), (3,)),
    ("2@1 2@3 4@9 2@3 2@1", ((2, 1), (2, 3), (4, 9)), (2, 2)),
    ("4@1 8@3 2@1", ((4, 1), (8, 3)), (2,)),
    ("1@1 2@2 3@6 4@2 5@1", ((1, 1), (2, 2), (3, 6)), (5, 4)),
    ("0@1 6@4 0@1", ((0, 1), (6, 4)), (0,)),
    ("8@1", ((8, 1),), ()),
    ("  2@1   4@3 2@1 ", ((2, 1), (4, 3)), (2,)),
])
def test_paper_notation_parses_to_levels(text, levels, post):
  hierarchy = parse_hierarchy(text)
  assert hierarchy.levels == levels
  assert hierarchy.post_layers == post
  assert str(hierarchy) == " ".join(text.split())


def test_relative_factors_and_totals():
  hierarchy = parse_hierarchy("2@1 2@3 4@9 2@3 2@1")
  assert hierarchy.depth == 2
  assert [hierarchy.relative_factor(i) for i in range(2)] == [3, 3]
  assert hierarchy.total_factor == 9
  assert hierarchy.num_layers == 12


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("   ", "empty"),
    ("5@1 24@3", "odd number"),
    ("5@3 24@9 5@3", "start and end with a full-resolution @1"),
    ("2@1 4@3 2@2", "start and end"),
    ("2@1 4@3 4@9 2@1 2@3", "start and end"),
    ("2@1 4@3 4@9 4@6 2@1", "not symmetric"),
    ("2@1 2@3 4@3 2@3 2@1", "repeated"),
    ("2@1 2@1 2@1", "repeated"),
    ("2@1 2@6 4@4 2@6 2@1", "must rise"),
    ("2@1 2@2 4@3 2@2 2@1", "does not divide"),
    ("2@1 0@3 2@1", "center level needs at least one layer"),
    ("2@1 x@3 2@1", "'x@3'"),
    ("2@1 4@ 2@1", "'4@'"),
    ("2@1 @3 2@1", "'@3'"),
    ("2@1 -4@3 2@1", "'-4@3'"),
    ("2@1 4.5@3 2@1", "'4.5@3'"),
    ("2x1", "'2x1'"),
    ("2@1,4@3,2@1", "'2@1,4@3,2@1'"),
])
def test_malformed_hierarchies_raise_naming_field_and_value(text, message):
  with pytest.raises(ValueError) as error:
    parse_hierarchy(text)
  assert "model.hierarchy=" in str(error.value)
  assert repr(text) in str(error.value)
  assert message in str(error.value)
  assert "e.g. '5@1 24@3 5@1'" in str(error.value)
