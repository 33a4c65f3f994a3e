"""Where the test suite's time goes: per-file seconds from a pytest JUnit XML report, appended as one record to
benchmarks/results/test_suite.json, and printed as a markdown table (docs/testing.md quotes it).

    .venv/bin/python -m pytest -n 2 -q --junitxml=/tmp/suite.xml        # or a fresh clone's `bash .ci/run`
    .venv/bin/python scripts/suite_durations.py /tmp/suite.xml --wall 540 --label "fresh clone, bash .ci/run"

Seconds are each test's setup + call + teardown as pytest reports them, summed per file: with `-n 2` two files run
at once, so the column adds up to about twice the wall time. `--wall` is the run's own wall-clock time (the
caller measures it); the load average is read when this script runs, so run it right after the suite.
"""

import argparse
import collections
import datetime
import json
import os
import pathlib
import xml.etree.ElementTree as ElementTree

RESULTS = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "test_suite.json"


def per_file(report: pathlib.Path) -> tuple[dict, collections.Counter]:
  """({file: [seconds, tests]}, outcome counts) of a JUnit XML report."""
  files, outcomes = {}, collections.Counter()
  for case in ElementTree.parse(report).getroot().iter("testcase"):
    name = case.get("classname", "").split(".")
    path = "/".join(name[:2]) + ".py" if len(name) >= 2 else case.get("file", "?")
    entry = files.setdefault(path, [0.0, 0])
    entry[0] += float(case.get("time", 0.0))
    entry[1] += 1
    tags = {child.tag for child in case}
    outcomes["skipped" if "skipped" in tags else "failed" if tags & {"failure", "error"} else "passed"] += 1
  return files, outcomes


def table(record: dict, rows: int) -> str:
  files = sorted(record["files"].items(), key=lambda item: -item[1]["seconds"])
  lines = ["| file | tests | seconds |", "|---|---:|---:|"]
  lines += [f"| {path} | {entry['tests']} | {entry['seconds']:.0f} |" for path, entry in files[:rows]]
  rest = files[rows:]
  if rest:
    lines.append(f"| {len(rest)} other files | {sum(e['tests'] for _, e in rest)} | "
                 f"{sum(e['seconds'] for _, e in rest):.0f} |")
  return "\n".join(lines)


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("report", type=pathlib.Path, help="pytest --junitxml file")
  parser.add_argument("--wall", type=float, required=True, help="the run's wall-clock seconds")
  parser.add_argument("--label", default="", help="what was run, e.g. 'fresh clone, bash .ci/run'")
  parser.add_argument("--rows", type=int, default=15, help="files in the printed table")
  parser.add_argument("--results", type=pathlib.Path, default=RESULTS)
  args = parser.parse_args(argv)
  files, outcomes = per_file(args.report)
  record = dict(date=datetime.date.today().isoformat(), label=args.label, wall_s=round(args.wall),
                cores=os.cpu_count(), load_average=round(os.getloadavg()[0], 2), outcomes=dict(outcomes),
                files={path: dict(seconds=round(s, 1), tests=n) for path, (s, n) in files.items()})
  runs = json.loads(args.results.read_text()) if args.results.exists() else []
  temporary = args.results.with_suffix(".json.partial")
  temporary.write_text(json.dumps(runs + [record], indent=1) + "\n")
  temporary.replace(args.results)
  print(f"{record['label']}: {record['wall_s']} s wall, {dict(outcomes)}, {record['cores']} cores, "
        f"load {record['load_average']}\n")
  print(table(record, args.rows))


if __name__ == "__main__":
  main()
