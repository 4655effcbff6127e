#!/usr/bin/env bash
# `make chaos`: the chaos run (docs/chaos.md) against a lab of its own (directory
# /tmp/bulkhead-lab-chaos, ports from 18400, external addresses 127.0.3.n), so neither the
# e2e lab (17400, 127.0.2.n) nor a demo lab is disturbed. Starts that lab when it is not
# running and stops it afterwards; BULKHEAD_KEEP_LAB=1 keeps it. CHAOS_SECONDS (default
# 180) and CHAOS_SEED (default random, printed) choose the schedule; the exit status is the
# chaos binary's: 0 passed, 1 a violation or a template that did not converge, 2 no verdict.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
export BULKHEAD_LAB_DIR="${BULKHEAD_LAB_DIR:-/tmp/bulkhead-lab-chaos}"
export BULKHEAD_LAB_PORT_BASE="${BULKHEAD_LAB_PORT_BASE:-18400}"
export BULKHEAD_LAB_ADDRESS_OCTET="${BULKHEAD_LAB_ADDRESS_OCTET:-3}"

target="${CARGO_TARGET_DIR:-$root/target}"
[[ "$target" == /* ]] || target="$root/$target"
cargo build -q -p bulkhead-e2e --bin chaos
# `--schedule-only` prints the schedule and needs no lab.
if [[ " $* " == *" --schedule-only "* ]]; then
  exec "$target/debug/chaos" "$@"
fi
# shellcheck source=e2e/lab-session.sh
source e2e/lab-session.sh
"$target/debug/chaos" "$@"
