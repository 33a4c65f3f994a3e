# `make train`: the main job. `make test`: the test suite. Both set up .venv first (Python >= 3.12).
VENV := .venv
STAMP := $(VENV)/.installed
WORKDIR ?= workdirs/default
CONFIG ?= configs/default.py

.PHONY: train test setup clean

$(STAMP): setup.cfg pyproject.toml scripts/setup_venv.sh
	bash scripts/setup_venv.sh
	touch $(STAMP)

setup: $(STAMP)

train: $(STAMP)
	$(VENV)/bin/hourglass-train --config=$(CONFIG) --workdir=$(WORKDIR)

test: $(STAMP)
	$(VENV)/bin/python -m pytest -n 2 -q

clean:
	rm -rf $(VENV) workdirs .pytest_cache
