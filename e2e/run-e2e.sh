#!/usr/bin/env bash
# Runs the end-to-end tests against a lab of their own (directory /tmp/bulkhead-lab-e2e,
# ports from 17400, external addresses 127.0.2.n), so a demo lab left running by
# `make demo` is never disturbed. Starts that lab when it is not running and stops it
# afterwards; BULKHEAD_KEEP_LAB=1 keeps it for another run. Set BULKHEAD_LAB_DIR,
# BULKHEAD_LAB_PORT_BASE and BULKHEAD_LAB_ADDRESS_OCTET to use another lab.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export BULKHEAD_LAB_DIR="${BULKHEAD_LAB_DIR:-/tmp/bulkhead-lab-e2e}"
export BULKHEAD_LAB_PORT_BASE="${BULKHEAD_LAB_PORT_BASE:-17400}"
export BULKHEAD_LAB_ADDRESS_OCTET="${BULKHEAD_LAB_ADDRESS_OCTET:-2}"

# shellcheck source=e2e/lab-session.sh
source e2e/lab-session.sh
# Leading `--test <file>` pairs choose test files (e.g. `--test stateful_safety`); the
# rest goes to the test harness (name filters, --ignored, --nocapture).
targets=()
while [[ "${1:-}" == "--test" && -n "${2:-}" ]]; do
  targets+=(--test "$2")
  shift 2
done
[[ ${#targets[@]} -gt 0 ]] || targets=(--tests)
cargo test -p bulkhead-e2e "${targets[@]}" -- --test-threads=1 "$@"
