"""BENCHMARKS.md is what benchmarks/report.py makes of benchmarks/results/: a reference page, under 25 KB, with
dates only in its tables' date columns."""

import re

from benchmarks import report


def test_the_committed_page_is_what_the_results_make():
  page = report.page()
  assert report.PAGE.read_text() == page, "BENCHMARKS.md is stale: run `make bench-report`"
  assert len(page.encode()) <= 25 * 1024
  dated = [line for line in page.splitlines() if re.search(r"\b20\d\d-\d\d-\d\d\b", line)]
  assert dated and all(line.startswith("| ") for line in dated), [l for l in dated if not l.startswith("| ")]
  assert not re.search(r"\b[0-9a-f]{7,40}\b", page)  # no commit hashes


def test_check_mode_fails_on_a_stale_page(tmp_path, monkeypatch, capsys):
  stale = tmp_path / "BENCHMARKS.md"
  stale.write_text("# Benchmarks\n")
  monkeypatch.setattr(report, "PAGE", stale)
  assert report.main(["--check"]) == 1
  assert "make bench-report" in capsys.readouterr().err
