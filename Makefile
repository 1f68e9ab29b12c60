# Two commands do all the set-up on a fresh machine with only Python and pip:
#   make demo   - the demo against the embedded sandbox provider
#   make test   - lint, type check and the whole test suite
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: demo test lint bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.sandbox-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[sandbox]'
	touch $@

$(VENV)/.dev-installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $@ $(VENV)/.sandbox-installed

demo: $(VENV)/.sandbox-installed
	$(BIN)/payonce demo

lint: $(VENV)/.dev-installed
	$(BIN)/ruff check src tests bench examples
	$(BIN)/ruff format --check src tests bench examples
	$(BIN)/mypy --strict src

# pytest exits 5 when it collected no test; make treats that as a failure, as it should.
test: lint
	$(BIN)/python -m pytest

bench: $(VENV)/.sandbox-installed
	$(BIN)/python bench/sequential.py

clean:
	rm -rf $(VENV) build dist .pytest_cache .mypy_cache .ruff_cache
