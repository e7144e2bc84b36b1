#!/usr/bin/env bash
# Run a command with MEMSTORE_TEST_PGBOUNCER_URL pointing at PgBouncer in transaction pooling mode,
# in front of the PostgreSQL server of MEMSTORE_TEST_PG_URL (so run it inside with-postgres.sh).
#
# If MEMSTORE_TEST_PGBOUNCER_URL is already set, the command runs against that pooler. Otherwise a
# throwaway pgbouncer is started on a free 127.0.0.1 port in a temp dir, and stopped when the command
# ends: `pool_mode = transaction`, every database of the server reachable under its own name (so a
# test's fresh database is too), any role the server knows let in (auth_query, as the server trusts
# loopback). Installs Debian's pgbouncer package when the binary is missing and we are root. If no
# pooler can be started, the command still runs and the PgBouncer tests skip visibly (and fail
# under CI=true).
set -euo pipefail

if [[ -n "${MEMSTORE_TEST_PGBOUNCER_URL:-}" ]]; then
  exec "$@"
fi
if [[ -z "${MEMSTORE_TEST_PG_URL:-}" ]]; then
  echo "with-pgbouncer: MEMSTORE_TEST_PG_URL is not set; PgBouncer tests will be skipped" >&2
  exec "$@"
fi

find_pgbouncer() { command -v pgbouncer || { [[ -x /usr/sbin/pgbouncer ]] && echo /usr/sbin/pgbouncer; } || true; }
PGBOUNCER=$(find_pgbouncer)
if [[ -z "$PGBOUNCER" && $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  echo "with-pgbouncer: installing the pgbouncer package" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends pgbouncer >/dev/null || true
  PGBOUNCER=$(find_pgbouncer)
fi
if [[ -z "$PGBOUNCER" ]] || { [[ $(id -u) -eq 0 ]] && ! command -v runuser >/dev/null; }; then
  echo "with-pgbouncer: no pgbouncer binary; PgBouncer tests will be skipped" >&2
  exec "$@"
fi

# The server's address, user and database, read from its URL (python3 is on every machine that runs this).
read -r PGHOST PGPORT PGUSER PGDB < <(python3 - "$MEMSTORE_TEST_PG_URL" <<'PY'
import sys
from urllib.parse import urlsplit
url = urlsplit(sys.argv[1])
print(url.hostname or "127.0.0.1", url.port or 5432, url.username or "postgres", url.path.lstrip("/") or "postgres")
PY
)

run_as() {
  if [[ $(id -u) -eq 0 ]]; then
    id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

BOUNCERTMP=$(mktemp -d /tmp/memstore-pgbouncer.XXXXXX)
[[ $(id -u) -eq 0 ]] && { id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres; chown postgres "$BOUNCERTMP"; }
BOUNCERPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

bouncer_stop() {
  if [[ -f "$BOUNCERTMP/pgbouncer.pid" ]]; then
    kill "$(cat "$BOUNCERTMP/pgbouncer.pid")" 2>/dev/null || true
    for _ in $(seq 50); do [[ -f "$BOUNCERTMP/pgbouncer.pid" ]] || break; sleep 0.1; done
  fi
  rm -rf "$BOUNCERTMP"
}
trap bouncer_stop EXIT

printf '"%s" ""\n' "$PGUSER" >"$BOUNCERTMP/users.txt"
cat >"$BOUNCERTMP/pgbouncer.ini" <<INI
[databases]
* = host=$PGHOST port=$PGPORT
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $BOUNCERPORT
unix_socket_dir =
pool_mode = transaction
auth_type = trust
auth_file = $BOUNCERTMP/users.txt
auth_user = $PGUSER
auth_query = SELECT rolname, NULL::text FROM pg_catalog.pg_roles WHERE rolname = \$1 AND rolcanlogin
max_client_conn = 1000
default_pool_size = 10
server_idle_timeout = 10
ignore_startup_parameters = extra_float_digits
logfile = $BOUNCERTMP/pgbouncer.log
pidfile = $BOUNCERTMP/pgbouncer.pid
INI
[[ $(id -u) -eq 0 ]] && chown postgres "$BOUNCERTMP"/*
if ! run_as "$PGBOUNCER" -d "$BOUNCERTMP/pgbouncer.ini"; then
  echo "with-pgbouncer: pgbouncer did not start; PgBouncer tests will be skipped" >&2
  cat "$BOUNCERTMP/pgbouncer.log" >&2 || true
  set +e; "$@"; status=$?; exit $status
fi
listening() { python3 -c "import socket; socket.create_connection(('127.0.0.1', $BOUNCERPORT), timeout=1)" 2>/dev/null; }
for _ in $(seq 100); do listening && break; sleep 0.1; done
if ! listening; then
  echo "with-pgbouncer: pgbouncer started but does not accept connections on 127.0.0.1:$BOUNCERPORT" >&2
  cat "$BOUNCERTMP/pgbouncer.log" >&2 || true
  exit 1
fi
export MEMSTORE_TEST_PGBOUNCER_URL="postgresql+psycopg://$PGUSER@127.0.0.1:$BOUNCERPORT/$PGDB"
echo "with-pgbouncer: throwaway pgbouncer (transaction pooling) on 127.0.0.1:$BOUNCERPORT" >&2

set +e
"$@"
status=$?
set -e
exit $status
