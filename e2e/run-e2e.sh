#!/usr/bin/env bash
# Runs the end-to-end tests against the lab. Starts the lab when it is not running and
# stops it afterwards (a lab that was already running, e.g. from `make demo`, is reused
# and left running). BULKHEAD_KEEP_LAB=1 keeps a lab this script started.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

cargo build -q -p bulkhead --bin bulkhead
up_output="$(e2e/lab up)"
echo "$up_output"
started=0
grep -q "already running" <<<"$up_output" || started=1
cleanup() {
  if [[ $started -eq 1 && -z "${BULKHEAD_KEEP_LAB:-}" ]]; then
    e2e/lab down
  else
    e2e/lab heal-all >/dev/null 2>&1 || true
  fi
}
trap cleanup EXIT
cargo test -p bulkhead-e2e --tests -- --test-threads=1 "$@"
