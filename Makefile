# The two commands of the README, and what they stand on.
# Each target installs what it needs on first use: a virtualenv in .venv with the
# package and its test extras, and (for the tests) the system tools the sandbox
# providers use.

PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
INSTALLED := $(VENV)/.installed
# Six: the long fleet tests mostly wait (leases, paced agents); at four the CPU idled
# for a quarter of a run (perf), and at six a run took 15:50 instead of 19:41.
PYTEST_WORKERS ?= 6
# The suite runs its longest tests first (tests/tiers.py, tests/durations.json), handed
# out one at a time to whichever worker is free: the long tests run side by side from
# the start and the short ones fill the gaps at the end. (xdist's other schedulers hand
# each worker a run of consecutive tests first: one worker got every long test.)
PYTEST_DIST ?= --dist load --maxschedchunk 1
# `make demo DEMO_FLAGS=` keeps the stack and the dashboard up until Ctrl-C.
DEMO_FLAGS ?= --exit

.PHONY: demo test test-fast lint system-deps clean

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(INSTALLED)

demo: $(INSTALLED)
	$(BIN)/turnkeeper demo $(DEMO_FLAGS)

test: $(INSTALLED) system-deps
	$(BIN)/pytest -n $(PYTEST_WORKERS) $(PYTEST_DIST) --durations=25 -p no:cacheprovider

# The first two tiers (tests/tiers.py): no jail, no worker process, nothing slow.
test-fast: $(INSTALLED)
	$(BIN)/pytest -n $(PYTEST_WORKERS) $(PYTEST_DIST) -m "(pure or store) and not slow and not soak" -p no:cacheprovider

lint: $(INSTALLED)
	$(BIN)/ruff check .
	$(BIN)/mypy

system-deps:
	@scripts/system-deps

clean:
	rm -rf $(VENV) .turnkeeper .mypy_cache .ruff_cache
