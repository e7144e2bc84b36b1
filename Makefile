# `make test` and `make demo` set up .venv on first use, so each is one command on a fresh clone.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test lint typecheck pytest demo clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres]'
	touch $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	scripts/with-postgres.sh $(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

demo: $(STAMP)
	$(BIN)/memstore demo

clean:
	rm -rf $(VENV) .memstore .pytest_cache .mypy_cache .ruff_cache
