# `make test` and `make demo` set up .venv on first use, so each is one command on a fresh clone.
VENV ?= .venv
PYTHON ?= python3
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
BASE_STAMP := $(VENV)/.installed-base

.PHONY: setup test lint typecheck pytest pytest-pgbouncer demo clean migrations bench

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev,postgres,redis,langchain,server,mcp,bench,local-embeddings]'
	touch $(STAMP)

# The demo needs only the base package: no dev tools, no optional integrations.
$(BASE_STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet -e .
	touch $(BASE_STAMP)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

# One worker per core (pytest-xdist): every test has its own tmp_path and database, and the suite
# is CPU-bound, so two cores halve it. PYTEST_ARGS="-n 0" runs it in one process. Each with-*.sh
# starts a throwaway server (PostgreSQL, PgBouncer, Redis) unless its MEMSTORE_TEST_*_URL is set;
# with-chromium.sh finds (or, as root on Debian, installs) the Chromium the browser tests drive.
# With no PYTEST_ARGS a second pass follows: the contract, queue and isolation suites' PostgreSQL
# tests through PgBouncer in transaction pooling mode (scripts/run-pytest.sh; pytest-pgbouncer alone).
SERVERS := scripts/with-postgres.sh scripts/with-pgbouncer.sh scripts/with-redis.sh scripts/with-chromium.sh

pytest: $(STAMP)
	$(SERVERS) scripts/run-pytest.sh $(BIN)/python $(PYTEST_ARGS)

pytest-pgbouncer: $(STAMP)
	$(SERVERS) scripts/run-pytest.sh $(BIN)/python --pooled

test: lint typecheck pytest

# Re-render migrations/ from alembic/versions (REGENERATE=1 first rebuilds revision 0001 from models.py).
migrations: $(STAMP)
	$(BIN)/python scripts/render_migrations.py $(if $(REGENERATE),--regenerate-initial)

demo: $(BASE_STAMP)
	$(BIN)/memstore demo

# Benchmarks into .bench/ (git ignores it). BENCH_ARGS=--quick for a run of a few minutes;
# BENCH_ARGS=--write-docs refreshes the published bench/ and docs/performance.md instead;
# MEMSTORE_BENCH_PG_URL=postgresql+psycopg://user@host/postgres adds the PostgreSQL scenarios.
bench: $(STAMP)
	$(BIN)/python scripts/bench.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .memstore .pytest_cache .mypy_cache .ruff_cache
