#!/usr/bin/env bash
# Run a command with MEMSTORE_TEST_PG_URL pointing at a PostgreSQL server.
#
# If MEMSTORE_TEST_PG_URL is already set, the command runs against that server.
# Otherwise a throwaway server is started in a temp dir (initdb + pg_ctl through
# runuser as the postgres user, because both refuse to run as root), and stopped
# when the command ends. Installs Debian's postgresql package when no server binaries
# exist and we are root. If no server can be started, the command still runs and
# the PostgreSQL tests skip visibly (and fail under CI=true).
set -euo pipefail

if [[ -n "${MEMSTORE_TEST_PG_URL:-}" ]]; then
  exec "$@"
fi

find_pgbin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }

PGBIN=$(find_pgbin || true)
if [[ -z "$PGBIN" && $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  echo "with-postgres: installing the postgresql package" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends postgresql >/dev/null
  PGBIN=$(find_pgbin || true)
fi
if [[ -z "$PGBIN" ]] || { [[ $(id -u) -eq 0 ]] && ! command -v runuser >/dev/null; }; then
  echo "with-postgres: no PostgreSQL server binaries; PostgreSQL tests will be skipped" >&2
  exec "$@"
fi

run_pg() {
  if [[ $(id -u) -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

PGTMP=$(mktemp -d /tmp/memstore-pg.XXXXXX)
[[ $(id -u) -eq 0 ]] && { id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres; chown postgres:postgres "$PGTMP"; }
PGPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

pg_stop() {
  run_pg "$PGBIN/pg_ctl" -D "$PGTMP/data" -m fast -w stop >/dev/null 2>&1 || true
  rm -rf "$PGTMP"
}
trap pg_stop EXIT

run_pg "$PGBIN/initdb" -D "$PGTMP/data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 --no-sync \
  >"$PGTMP/initdb.log"
run_pg "$PGBIN/pg_ctl" -D "$PGTMP/data" -l "$PGTMP/server.log" -w -t 60 \
  -o "-c listen_addresses=127.0.0.1 -p $PGPORT -k $PGTMP -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" \
  start >/dev/null
"$PGBIN/createdb" -h 127.0.0.1 -p "$PGPORT" -U postgres memstore_test
export MEMSTORE_TEST_PG_URL="postgresql+psycopg://postgres@127.0.0.1:$PGPORT/memstore_test"
echo "with-postgres: throwaway server on 127.0.0.1:$PGPORT" >&2

set +e
"$@"
status=$?
set -e
exit $status
