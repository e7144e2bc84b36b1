#!/usr/bin/env bash
# Run a command with MEMSTORE_TEST_CHROMIUM pointing at a Chromium binary for the console's browser
# tests (tests/browser, Playwright driving it; Playwright never downloads a browser of its own).
#
# If MEMSTORE_TEST_CHROMIUM is already set, the command runs with it. Otherwise the machine's
# chromium is used; when there is none and we are root on Debian, the chromium package is installed.
# With no browser at all the command still runs and the browser tests skip visibly (and fail
# under CI=true).
set -euo pipefail

if [[ -n "${MEMSTORE_TEST_CHROMIUM:-}" ]]; then
  exec "$@"
fi
find_chromium() {
  for name in chromium chromium-browser google-chrome; do
    command -v "$name" && return
  done
  true
}
CHROMIUM=$(find_chromium)
if [[ -z "$CHROMIUM" && $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
  echo "with-chromium: installing the chromium package" >&2
  export DEBIAN_FRONTEND=noninteractive
  { apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }; } || true
  CHROMIUM=$(find_chromium)
fi
if [[ -z "$CHROMIUM" ]]; then
  echo "with-chromium: no chromium binary; the browser tests will be skipped" >&2
  exec "$@"
fi
export MEMSTORE_TEST_CHROMIUM="$CHROMIUM"
echo "with-chromium: $CHROMIUM" >&2
exec "$@"
