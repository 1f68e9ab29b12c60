# Two commands do all the set-up on a fresh machine with only Python and pip:
#   make demo      - the demo against the embedded sandbox provider
#   make test-all  - lint, type check and the whole test suite (what CI runs)
# and, while working, the inner loop (the same without the slow lane, the tests marked slow):
#   make test
# and the slow lane alone:
#   make test-slow
# and one more builds the documentation site into site/:
#   make docs   - mkdocs build --strict (CI runs it after make test)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The suite runs in this many processes (pytest-xdist): most of its time is spent waiting on
# servers and child processes, so two workers halve it even on a 2-core machine. Each
# worker starts its own sandbox and PostgreSQL server. PYTEST_WORKERS=0 runs in-process.
PYTEST_WORKERS ?= 2

.PHONY: demo test test-all test-slow lint test-packages docs bench simulate clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.sandbox-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[sandbox]'
	touch $@

# The benchmarks run the sandbox, a PostgreSQL journal and the aiohttp transport too.
$(VENV)/.bench-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[sandbox,postgres,aiohttp]'
	touch $@ $(VENV)/.sandbox-installed

$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.sandbox-installed $(VENV)/.bench-installed

$(VENV)/.docs-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[docs]'
	touch $@

demo: $(VENV)/.sandbox-installed
	$(BIN)/payonce demo

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy --strict src

# Debian packages some tests run for real: libfaketime (`faketime`), for a host's clock set
# back or ahead across a crash and resume; dbus and gnome-keyring, the Secret Service the
# keyring tests run against (tests/helpers/secret_service.py); systemd, whose
# `systemd-analyze verify` checks docs/deploying.md's unit. Installed here, in one apt
# call, only where one is missing and this is root with apt (CI, a fresh machine); anywhere
# else nothing is installed and those tests skip, saying why (with CI=true they fail
# instead). Quiet when there is nothing to do.
DEBIAN_TEST_PACKAGES := faketime dbus gnome-keyring systemd
APT_GET := DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=120 -qq
test-packages:
	@missing=""; \
	for package in $(DEBIAN_TEST_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$package 2>/dev/null | grep -q 'ok installed' \
	    || missing="$$missing $$package"; \
	done; \
	if [ -z "$$missing" ]; then \
	  :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing Debian packages the tests use:$$missing"; \
	  log=$$(mktemp); \
	  if { $(APT_GET) update && $(APT_GET) install -y --no-install-recommends $$missing; } \
	       >"$$log" 2>&1; then rm -f "$$log"; \
	  else cat "$$log"; rm -f "$$log"; \
	    echo "warning: apt-get failed: the tests that need$$missing will skip (fail with CI=true)"; fi; \
	else \
	  echo "note: missing here:$$missing: the tests that need them will skip, or fail with" \
	    "CI=true (on Debian: apt-get install$$missing)"; \
	fi

# pytest exits 5 when it collected no test; make treats that as a failure, as it should.
# The inner loop: every test but the slow lane (the crash soak, the examples run as
# services, the many-process races, the other scenarios of 1.5 s or more), which
# `make test-all` and CI run too.
test: lint test-packages
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m "not slow"

# The slow lane alone.
test-slow: $(VENV)/.dev-installed test-packages
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) -m slow

# The whole suite in one run (CI's command): lint, types, both lanes.
test-all: lint test-packages
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS)

# --strict turns every warning into a failure: a broken link or anchor, a page left out of
# the nav, an API name mkdocstrings cannot find. Nothing is fetched from the network.
docs: $(VENV)/.docs-installed
	$(BIN)/mkdocs build --strict --site-dir site

# Every row of issue 10's table, each as a ratio within one run, and issue 19's many-process
# table, in about 5 minutes on a 2-CPU machine: shorter runs than each script's defaults (run
# one alone for those).
bench: $(VENV)/.bench-installed
	$(BIN)/python bench/sequential.py --requests 1000 --rounds 3 --warmup 100
	$(BIN)/python bench/overhead.py --intents 2000 --rounds 3
	$(BIN)/python bench/overhead_ablation.py --intents 1000 --rounds 3
	$(BIN)/python bench/overhead_ablation.py --intents 1000 --rounds 3 --async
	$(BIN)/python bench/async_concurrency.py --quick
	$(BIN)/python bench/journal.py --quick
	$(BIN)/python bench/import_time.py --rounds 9
	$(BIN)/python bench/verify.py --quick
	$(BIN)/python bench/many_processes.py --quick

# The simulator of issue 26 (tests/simulation/): SEEDS runs of the model world on every core,
# a progress line, then runs/s, steps, coverage and each broken invariant's shrunk story.
# SIMULATE_FLAGS=--all-features adds the world's features whose double payments are not
# fixed yet (issue 27); --seed N --story replays one run.
SEEDS ?= 1000
SIMULATE_FLAGS ?=
simulate: $(VENV)/.dev-installed
	$(BIN)/python tests/simulation/run.py --seeds $(SEEDS) $(SIMULATE_FLAGS)

clean:
	rm -rf $(VENV) build dist site .pytest_cache .mypy_cache .ruff_cache
