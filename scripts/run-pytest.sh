#!/usr/bin/env bash
# make test's pytest passes: run inside with-postgres.sh, with-pgbouncer.sh and with-redis.sh.
#
#   run-pytest.sh PYTHON [PYTEST_ARGS...]   the whole suite; with no PYTEST_ARGS, then the pooled pass
#   run-pytest.sh PYTHON --pooled           the pooled pass alone
#
# The pooled pass runs the PostgreSQL tests of the contract, queue and isolation suites again with
# every test database reached through PgBouncer in transaction pooling mode (docs/scale.md), so
# nothing memstore does may rely on state that outlives a transaction on a server connection.
#
# Work is stolen between workers (--dist worksteal): test durations range from milliseconds to half
# a minute, and a fixed split leaves one core idle at the end. --durations lists the slowest tests.
set -euo pipefail

PYTHON=$1
shift
POOLED_SUITES=(
  tests/integration/test_storage_contract.py tests/integration/test_session_store_contract.py
  tests/integration/test_face_contract.py tests/integration/test_database_queue.py
  tests/integration/test_queue_round_trips.py
  tests/reliability/test_durable_queue.py tests/reliability/test_queue_poison.py
  tests/reliability/test_queue_tenants.py tests/reliability/test_queue_scopes.py
  tests/reliability/test_isolation.py tests/integration/test_row_level_security.py
  tests/integration/test_tenant_entry_points.py tests/reliability/test_leak_arena.py
  tests/reliability/test_leak_arena_agent_docs.py tests/reliability/test_leak_arena_entry_points.py
  tests/reliability/test_leak_arena_sessions.py tests/reliability/test_leak_arena_store_items.py
)

pooled() {
  echo "run-pytest: the pooled pass, through PgBouncer" >&2
  MEMSTORE_TEST_THROUGH_PGBOUNCER=1 "$PYTHON" -m pytest -n auto --dist worksteal --durations=15 -m postgres "${POOLED_SUITES[@]}"
}

if [[ "${1:-}" == "--pooled" ]]; then
  pooled
  exit
fi
"$PYTHON" -m pytest -n auto --dist worksteal --durations=40 "$@"
if [[ $# -eq 0 ]]; then
  pooled
fi
