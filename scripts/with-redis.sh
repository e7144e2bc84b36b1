#!/usr/bin/env bash
# Run a command with MEMSTORE_TEST_REDIS_URL pointing at a Redis server.
#
# If MEMSTORE_TEST_REDIS_URL is already set, the command runs against that server.
# Otherwise a throwaway redis-server is started on a free 127.0.0.1 port in a temp dir
# (no persistence: nothing is saved), and stopped when the command ends. Installs
# Debian's redis-server package when the binary is missing and we are root. If no
# server can be started, the command still runs and the Redis tests skip visibly
# (and fail under CI=true).
set -euo pipefail

if [[ -n "${MEMSTORE_TEST_REDIS_URL:-}" ]]; then
  exec "$@"
fi

if ! command -v redis-server >/dev/null && [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  echo "with-redis: installing the redis-server package" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server >/dev/null || true
fi
if ! command -v redis-server >/dev/null; then
  echo "with-redis: no redis-server binary; Redis tests will be skipped" >&2
  exec "$@"
fi

REDISTMP=$(mktemp -d /tmp/memstore-redis.XXXXXX)
REDISPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
REDISPID=""

redis_stop() {
  if [[ -n "$REDISPID" ]]; then
    kill "$REDISPID" 2>/dev/null || true
    wait "$REDISPID" 2>/dev/null || true
  fi
  rm -rf "$REDISTMP"
}
trap redis_stop EXIT

redis-server --bind 127.0.0.1 --port "$REDISPORT" --dir "$REDISTMP" --save '' --appendonly no \
  --daemonize no --logfile "$REDISTMP/server.log" &
REDISPID=$!

# Wait until it answers PING (redis-cli may be missing, so ask with a socket).
ready() {
  python3 - "$REDISPORT" <<'PY'
import socket, sys
try:
    with socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1) as conn:
        conn.sendall(b"PING\r\n")
        sys.exit(0 if conn.recv(16).startswith(b"+PONG") else 1)
except OSError:
    sys.exit(1)
PY
}
for _ in $(seq 1 100); do
  ready && break
  kill -0 "$REDISPID" 2>/dev/null || break
  sleep 0.1
done
if ! ready; then
  echo "with-redis: redis-server did not start ($(tail -3 "$REDISTMP/server.log" 2>/dev/null | tr '\n' ' ')); Redis tests will be skipped" >&2
  set +e
  "$@"
  exit $?
fi
export MEMSTORE_TEST_REDIS_URL="redis://127.0.0.1:$REDISPORT/0"
echo "with-redis: throwaway server on 127.0.0.1:$REDISPORT" >&2

set +e
"$@"
status=$?
set -e
exit $status
