#!/usr/bin/env bash
# `make demo`: the main job. Brings up the lab (building the upstream binaries on first
# use), installs Bulkhead's CRDs on the hub and every member, and shows them. Everything
# is left running in the background; `make lab-down` stops it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

e2e/k8s/build.sh
e2e/lab up
e2e/lab install-crds
bin="$(e2e/k8s/build.sh --print)"
echo
for cluster in hub east west north; do
  echo "== $cluster: Bulkhead CRDs"
  "$bin/kubectl" --kubeconfig "$(e2e/lab kubeconfig "$cluster")" get crd \
    -o custom-columns='NAME:.metadata.name,ESTABLISHED:.status.conditions[?(@.type=="Established")].status,SCOPE:.spec.scope' \
    | grep -E 'NAME|example\.com'
done

# Membership: join the three members and run the hub in the background (docs/clusters.md).
cargo build -q -p bulkhead --bin bulkhead
bulkhead="$root/target/debug/bulkhead"
lab_dir="${BULKHEAD_LAB_DIR:-/tmp/bulkhead-lab}"
hub_kubeconfig="$(e2e/lab kubeconfig hub)"
for member in east:zone-a:region-1 west:zone-b:region-1 north:zone-c:region-2; do
  IFS=: read -r name zone region <<<"$member"
  "$bulkhead" join "$name" --kubeconfig "$(e2e/lab kubeconfig "$name")" \
    --zone "$zone" --region "$region" --hub-kubeconfig "$hub_kubeconfig"
done
hub_pid_file="$lab_dir/bulkhead-hub.pid"
if [[ -f "$hub_pid_file" ]] && kill -0 "$(cat "$hub_pid_file")" 2>/dev/null; then
  echo "bulkhead hub already runs (pid $(cat "$hub_pid_file"))"
else
  nohup "$bulkhead" hub --kubeconfig "$hub_kubeconfig" --probe-address 127.0.0.1:18080 \
    >"$lab_dir/bulkhead-hub.log" 2>&1 &
  echo $! >"$hub_pid_file"
  echo "started bulkhead hub (pid $!, log $lab_dir/bulkhead-hub.log, metrics http://127.0.0.1:18080/metrics)"
fi
for _ in $(seq 1 40); do
  "$bulkhead" get clusters --kubeconfig "$hub_kubeconfig" | awk 'NR > 1 && $3 != "True" {missing = 1} END {exit missing}' && break
  sleep 0.5
done
echo
echo "== bulkhead get clusters"
"$bulkhead" get clusters --kubeconfig "$hub_kubeconfig"

echo
e2e/lab status
cat <<MSG

The lab keeps running in the background.
  use it:   eval "\$(e2e/lab env)"; kubectl get mc     (the hub)
            kubectl --kubeconfig \$(e2e/lab kubeconfig east) get nodes
  cut off:  e2e/lab partition east; e2e/lab heal east
  hub:      target/debug/bulkhead get clusters --kubeconfig \$(e2e/lab kubeconfig hub)
            stop it: kill \$(cat $lab_dir/bulkhead-hub.pid)
  stop it:  make lab-down
The agents and sample policies join the demo as their issues land (see README).
MSG
