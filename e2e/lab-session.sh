# Sourced by e2e/run-e2e.sh and e2e/run-chaos.sh (from the repository root, with the lab's
# BULKHEAD_LAB_* variables set): builds the bulkhead binary, starts the lab unless it is
# already running, and on exit stops it again, or only heals its partitions when it was
# already running or BULKHEAD_KEEP_LAB=1 keeps it.
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
