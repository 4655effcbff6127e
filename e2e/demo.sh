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
kubectl_bin="$bin/kubectl"
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
# Background processes, one pid file each in the lab directory (`make lab-down` stops them).
# A process started from an older build of the binary is restarted.
start_bg() {
  local name="$1"; shift
  local pid_file="$lab_dir/$name.pid"
  if [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null && [[ "$pid_file" -nt "$bulkhead" ]]; then
    echo "$name already runs (pid $(cat "$pid_file"))"
  else
    if [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
      kill "$(cat "$pid_file")" && sleep 1
      echo "restarting $name: the binary was rebuilt"
    fi
    nohup "$@" >"$lab_dir/$name.log" 2>&1 &
    echo $! >"$pid_file"
    echo "started $name (pid $!, log $lab_dir/$name.log)"
  fi
}
start_bg bulkhead-hub "$bulkhead" hub --kubeconfig "$hub_kubeconfig" --probe-address 127.0.0.1:18080
for _ in $(seq 1 40); do
  "$bulkhead" get clusters --kubeconfig "$hub_kubeconfig" | awk 'NR > 1 && $3 != "True" {missing = 1} END {exit missing}' && break
  sleep 0.5
done
echo
echo "== bulkhead get clusters"
"$bulkhead" get clusters --kubeconfig "$hub_kubeconfig"


# The admission webhook for the hub and every member (docs/admission.md), and one agent
# per member, running inside its zone (docs/mydatabase.md).
members_inside=()
for member in east west north; do members_inside+=(--configure-member "$(e2e/lab kubeconfig "$member" --inside)"); done
start_bg bulkhead-webhook "$bulkhead" webhook --kubeconfig "$hub_kubeconfig" --listen 127.0.0.1:18443 \
  --url https://127.0.0.1:18443 --probe-address 127.0.0.1:18090 --configure-hub "${members_inside[@]}" --conversion
port=18081
for member in east west north; do
  start_bg "bulkhead-agent-$member" "$bulkhead" agent --kubeconfig "$(e2e/lab kubeconfig "$member" --inside)" \
    --probe-address "127.0.0.1:$port"
  port=$((port + 1))
done

# What the hub will do with the sample policy (placement from the hub arrives with its
# issue; `bulkhead plan` runs the same code offline, docs/placement.md).
cat >"$lab_dir/demo-web.yaml" <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop}
spec: {replicas: 6}
YAML
echo
echo "== bulkhead plan: the sample policy over the joined clusters, and if zone-a fails"
"$bulkhead" plan -f config/samples/propagationpolicy.yaml -f config/samples/mydatabase.yaml \
  -f "$lab_dir/demo-web.yaml" --clusters-from-hub --kubeconfig "$hub_kubeconfig" --fail zone-a

# The same on the hub for real: the scheduler writes one ResourceBinding per template
# with the decision and a reason per cluster. (Propagating the copies to the members
# arrives with its issue; the MyDatabase below in east is created there directly.)
"$kubectl_bin" --kubeconfig "$hub_kubeconfig" create namespace shop --dry-run=client -o yaml | "$kubectl_bin" --kubeconfig "$hub_kubeconfig" apply -f - >/dev/null
"$kubectl_bin" --kubeconfig "$hub_kubeconfig" apply -f config/samples/propagationpolicy.yaml -f config/samples/mydatabase.yaml >/dev/null
for _ in $(seq 1 40); do
  "$kubectl_bin" --kubeconfig "$hub_kubeconfig" -n shop get rb orders-mydatabase >/dev/null 2>&1 && break
  sleep 0.5
done
echo
echo "== hub: ResourceBinding shop/orders-mydatabase (the scheduler's decision)"
"$kubectl_bin" --kubeconfig "$hub_kubeconfig" -n shop get rb
"$kubectl_bin" --kubeconfig "$hub_kubeconfig" -n shop get rb orders-mydatabase \
  -o jsonpath='{range .status.decisions[*]}  {.cluster}{"\t"}selected={.selected}{"\t"}{.reason}{"\n"}{end}'

# A MyDatabase in east, run by east's agent. (Placing it from the hub arrives with the
# placement issue.) Then the partition drill: cut east off, watch its database fence
# itself read-only while the zone keeps serving reads, heal, watch it return.
kubectl="$bin/kubectl"
east_inside="$(e2e/lab kubeconfig east --inside)"
for _ in $(seq 1 60); do
  "$kubectl" --kubeconfig "$east_inside" get --raw /apis/example.com/v1 >/dev/null 2>&1 && break
  sleep 0.5
done
"$kubectl" --kubeconfig "$east_inside" create namespace shop --dry-run=client -o yaml | "$kubectl" --kubeconfig "$east_inside" apply -f - >/dev/null
for _ in $(seq 1 60); do
  "$kubectl" --kubeconfig "$east_inside" apply -f config/samples/mydatabase.yaml >/dev/null 2>&1 && break
  sleep 0.5
done
db_phase() { "$kubectl" --kubeconfig "$east_inside" -n shop get db orders -o jsonpath='{.status.phase}' 2>/dev/null; }
wait_phase() {
  local want="$1" started=$SECONDS
  for _ in $(seq 1 120); do
    [[ "$(db_phase)" == "$want" ]] && { echo "(orders is $want after $((SECONDS - started)) s)"; return 0; }
    sleep 0.5
  done
  echo "(orders did not reach $want; it is $(db_phase))"
}
show() {
  echo "== $1"
  "$bulkhead" get clusters --kubeconfig "$hub_kubeconfig" 2>/dev/null || echo "(hub unreachable)"
  "$kubectl" --kubeconfig "$east_inside" -n shop get db orders \
    -o custom-columns='DATABASE:.metadata.name,PHASE:.status.phase,READY:.status.readyReplicas,READ-ONLY:.status.conditions[?(@.type=="ReadOnly")].reason'
  for service in orders orders-ro; do
    printf 'Service %-10s ready endpoints: %s\n' "$service" \
      "$("$kubectl" --kubeconfig "$east_inside" -n shop get endpointslices -l kubernetes.io/service-name=$service \
         -o jsonpath='{.items[*].endpoints[*].conditions.ready}' | tr ' ' '\n' | grep -c true)"
  done
  echo
}
echo
wait_phase Ready
show "before: the hub renews east's lease, orders accepts writes"
e2e/lab partition east
wait_phase ReadOnly
started=$SECONDS
for _ in $(seq 1 80); do
  "$bulkhead" get clusters --kubeconfig "$hub_kubeconfig" | awk '$1 == "east" && $3 == "False" {found = 1} END {exit !found}' && break
  sleep 0.5
done
echo "(the hub marked east unreachable $((SECONDS - started)) s later: probes need failureThreshold misses)"
show "during: east is cut off from the hub; its agent fenced orders (no pod restarted)"
e2e/lab heal east
wait_phase Ready
started=$SECONDS
for _ in $(seq 1 80); do
  "$bulkhead" get clusters --kubeconfig "$hub_kubeconfig" | awk '$1 == "east" && $3 == "True" {found = 1} END {exit !found}' && break
  sleep 0.5
done
echo "(the hub marked east Ready $((SECONDS - started)) s later: probes need successThreshold successes)"
show "after: healed; the lease is fresh again and orders accepts writes"

echo
e2e/lab status
cat <<MSG

The lab keeps running in the background.
  use it:   eval "\$(e2e/lab env)"; kubectl get mc     (the hub)
            kubectl --kubeconfig \$(e2e/lab kubeconfig east) get nodes
  cut off:  e2e/lab partition east; e2e/lab heal east
  hub:      target/debug/bulkhead get clusters --kubeconfig \$(e2e/lab kubeconfig hub)
  agents:   logs in $lab_dir/bulkhead-agent-<member>.log; webhook in $lab_dir/bulkhead-webhook.log
  stop it:  make lab-down (stops the lab and every Bulkhead process of the demo)
Placement from the hub (propagation policies) joins the demo with its issue (see README).
MSG
