# `make train`: the main job. `make test`: the test suite. Both set up .venv first (Python >= 3.12).
# `make test-fast`: the suite without the tests marked slow or multiprocess (docs/testing.md).
# `make bench` / `make bench-quick`: the benchmark suite (see BENCHMARKS.md), full (about 1.5 hours on 2 busy CPU cores)
# or quick (a few minutes). `make bench-report`: BENCHMARKS.md rewritten from benchmarks/results/.
# `make mutation-check`: applies realistic one-line bugs one at a time to scratch copies and checks that the tests
# catch each (scripts/mutation_check.py; pass options with ARGS=..., e.g. ARGS="--only fixed_shift").
VENV := .venv
STAMP := $(VENV)/.installed
WORKDIR ?= workdirs/default
CONFIG ?= configs/default.py

BENCH_STAMP := $(VENV)/.bench-installed

.PHONY: train test test-fast setup clean bench bench-quick bench-report mutation-check

$(STAMP): setup.cfg pyproject.toml scripts/setup_venv.sh
	bash scripts/setup_venv.sh
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(VENV)/bin/hourglass-train --config=$(CONFIG) --workdir=$(WORKDIR)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 --dist loadfile -q --durations=20

test-fast: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 -q -m "not slow and not multiprocess"

$(BENCH_STAMP): $(STAMP) setup.cfg
	$(VENV)/bin/python -m pip install --quiet -e ".[test,bench]"
	touch $(BENCH_STAMP)

# The peer (lucidrains' PyTorch Hourglass) gets its own venv; without it, the peer comparison is skipped.
.venv-peer/bin/python:
	-bash benchmarks/peer/setup_peer.sh

bench: $(BENCH_STAMP) .venv-peer/bin/python
	$(VENV)/bin/python benchmarks/run_all.py

bench-quick: $(BENCH_STAMP) .venv-peer/bin/python
	$(VENV)/bin/python benchmarks/run_all.py --quick

bench-report: $(STAMP)
	$(VENV)/bin/python benchmarks/report.py

mutation-check: $(STAMP)
	$(VENV)/bin/python scripts/mutation_check.py --check-clean $(ARGS)

clean:
	rm -rf $(VENV) .venv-peer .jax_cache workdirs .pytest_cache
