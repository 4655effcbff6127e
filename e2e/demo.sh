#!/usr/bin/env bash
# `make demo`: the main job. Brings up the lab (building the upstream binaries on first
# use), installs Bulkhead's CRDs on every member and the Helm chart on the hub, and runs
# the hub with the chart's ServiceAccount. Everything
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
target="${CARGO_TARGET_DIR:-$root/target}"
[[ "$target" == /* ]] || target="$root/$target"
bulkhead="$target/debug/bulkhead"
lab_dir="${BULKHEAD_LAB_DIR:-/tmp/bulkhead-lab}"
hub_kubeconfig="$(e2e/lab kubeconfig hub)"
for member in east:zone-a:region-1 west:zone-b:region-1 north:zone-c:region-2; do
  IFS=: read -r name zone region <<<"$member"
  "$bulkhead" join "$name" --kubeconfig "$(e2e/lab kubeconfig "$name")" \
    --zone "$zone" --region "$region" --hub-kubeconfig "$hub_kubeconfig"
done
# Background processes, one pid file each in the lab directory (`make lab-down` stops them).
# A process started from an older build of the binary, or with other arguments, is restarted.
start_bg() {
  local name="$1"; shift
  local pid_file="$lab_dir/$name.pid" args_file="$lab_dir/$name.args"
  if [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null && [[ "$pid_file" -nt "$bulkhead" ]] \
    && [[ "$(cat "$args_file" 2>/dev/null)" == "$*" ]]; then
    echo "$name already runs (pid $(cat "$pid_file"))"
  else
    if [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
      kill "$(cat "$pid_file")" && sleep 1
      echo "restarting $name: the binary was rebuilt or its arguments changed"
    fi
    nohup "$@" >"$lab_dir/$name.log" 2>&1 &
    echo $! >"$pid_file"
    echo "$*" >"$args_file"
    echo "started $name (pid $!, log $lab_dir/$name.log)"
  fi
}

# Install Bulkhead on the hub with its Helm chart (docs/operations.md): CRDs, the hub's
# ServiceAccount and least-privilege RBAC, webhook certificates. The lab's hub has no
# kubelet, so the chart's Deployment never runs a pod: the hub process runs beside the API
# server instead, with a token of the chart's ServiceAccount as its only credential.
helm_bin="$bin/helm"
echo
echo "== helm upgrade --install bulkhead charts/bulkhead (on the hub)"
"$helm_bin" --kubeconfig "$hub_kubeconfig" upgrade --install bulkhead charts/bulkhead \
  --namespace bulkhead-system --create-namespace --take-ownership \
  --set-json 'webhook.certificates.extraIpAddresses=["127.0.0.1"]' | sed -n '1,/^NOTES/p'
token="$("$kubectl_bin" --kubeconfig "$hub_kubeconfig" -n bulkhead-system create token bulkhead --duration=720h)"
chart_kubeconfig="$lab_dir/hub-chart-account.kubeconfig"
cat >"$chart_kubeconfig" <<KUBECONFIG
apiVersion: v1
kind: Config
clusters:
- name: hub
  cluster:
    server: $("$kubectl_bin" --kubeconfig "$hub_kubeconfig" config view --raw -o jsonpath='{.clusters[0].cluster.server}')
    certificate-authority-data: $("$kubectl_bin" --kubeconfig "$hub_kubeconfig" config view --raw -o jsonpath='{.clusters[0].cluster.certificate-authority-data}')
users:
- name: bulkhead-system-bulkhead
  user:
    token: $token
contexts:
- name: hub
  context: {cluster: hub, user: bulkhead-system-bulkhead}
current-context: hub
KUBECONFIG
echo "the hub runs as: $("$kubectl_bin" --kubeconfig "$chart_kubeconfig" auth whoami -o jsonpath='{.status.userInfo.username}')"
# The hub's webhook (admission and MyDatabase conversion on the hub) with its certificates
# kept in the chart's Secret, as the chart runs it (the hub issues them into the Secret
# the first time, with 127.0.0.1 among the names); the lab's API server reaches it by URL
# (nothing routes Service IPs here).
# With leader election as the chart runs it (its Lease and Role in the release namespace).
start_bg bulkhead-hub "$bulkhead" hub --kubeconfig "$chart_kubeconfig" --probe-address 127.0.0.1:18080 \
  --leader-elect --leader-elect-namespace bulkhead-system --leader-elect-lease-name bulkhead-hub-leader \
  --webhook --listen 127.0.0.1:18444 --url https://127.0.0.1:18444 --conversion \
  --tls-secret bulkhead-system/bulkhead-webhook-certs --cert-sans 127.0.0.1,localhost
for _ in $(seq 1 40); do
  "$bulkhead" get clusters --kubeconfig "$hub_kubeconfig" | awk 'NR > 1 && $3 != "True" {missing = 1} END {exit missing}' && break
  sleep 0.5
done
echo
echo "== bulkhead get clusters"
"$bulkhead" get clusters --kubeconfig "$hub_kubeconfig"


# The admission webhook for every member (docs/admission.md; the hub's own runs in the hub
# process above), and one agent per member, running inside its zone (docs/mydatabase.md).
members_inside=()
for member in east west north; do members_inside+=(--configure-member "$(e2e/lab kubeconfig "$member" --inside)"); done
start_bg bulkhead-webhook "$bulkhead" webhook --kubeconfig "$hub_kubeconfig" --listen 127.0.0.1:18443 \
  --url https://127.0.0.1:18443 --probe-address 127.0.0.1:18090 "${members_inside[@]}" --conversion
port=18081
for member in east west north; do
  start_bg "bulkhead-agent-$member" "$bulkhead" agent --kubeconfig "$(e2e/lab kubeconfig "$member" --inside)" \
    --probe-address "127.0.0.1:$port" \
    --database-node-selector bulkhead.example.com/lab-runner=true --database-toleration bulkhead.example.com/lab-runner \
    --external-address-annotation bulkhead.example.com/lab-outside-address
  port=$((port + 1))
done

# What the hub will do with the sample policy: `bulkhead plan` runs the hub's placement
# code offline (docs/placement.md).
cat >"$lab_dir/demo-web.yaml" <<'YAML'
apiVersion: apps/v1
kind: Deployment
metadata: {name: web, namespace: shop, labels: {app: web}}
spec:
  replicas: 6
  selector: {matchLabels: {app: web}}
  template:
    metadata: {labels: {app: web}}
    spec: {containers: [{name: web, image: nginx}]}
YAML
echo
echo "== bulkhead plan: the sample policy over the joined clusters, and if zone-a fails"
"$bulkhead" plan -f config/samples/propagationpolicy.yaml -f config/samples/mydatabase.yaml \
  -f "$lab_dir/demo-web.yaml" --clusters-from-hub --kubeconfig "$hub_kubeconfig" --fail zone-a

# The same on the hub for real: the hub writes one ResourceBinding per template, applies
# the copies to the members (namespace shop is created there on demand), and each
# member's agent runs its share of the database.
kubectl="$kubectl_bin"
"$kubectl" --kubeconfig "$hub_kubeconfig" create namespace shop --dry-run=client -o yaml | "$kubectl" --kubeconfig "$hub_kubeconfig" apply -f - >/dev/null
"$kubectl" --kubeconfig "$hub_kubeconfig" apply -f config/samples/propagationpolicy.yaml \
  -f config/samples/mydatabase.yaml -f "$lab_dir/demo-web.yaml" >/dev/null
hub_db() { "$kubectl" --kubeconfig "$hub_kubeconfig" -n shop get db orders -o jsonpath="$1" 2>/dev/null; }
wait_until() {
  local what="$1" timeout="$2" started=$SECONDS; shift 2
  while (( SECONDS - started < timeout )); do
    "$@" && { echo "($what after $((SECONDS - started)) s)"; return 0; }
    sleep 0.5
  done
  echo "($what: not within $timeout s)"
}
db_ready() { [[ "$(hub_db '{.status.phase}')" == Ready ]]; }
web_ready() {
  [[ "$("$kubectl" --kubeconfig "$hub_kubeconfig" -n shop get deploy web -o jsonpath='{.status.readyReplicas}' 2>/dev/null)" == 6 ]]
}
member_phase() {
  "$kubectl" --kubeconfig "$(e2e/lab kubeconfig "$1" --inside)" -n shop get db orders -o jsonpath='{.status.phase}' 2>/dev/null
}
member_condition() {
  "$kubectl" --kubeconfig "$(e2e/lab kubeconfig "$1" --inside)" -n shop get db orders \
    -o jsonpath="{.status.conditions[?(@.type==\"$2\")].reason}" 2>/dev/null
}
# Fenced by the server: the phase, and every instance a hot standby that answers again.
east_read_only() {
  [[ "$(member_phase east)" == ReadOnly && "$(member_condition east PrimaryAvailable)" == Fenced ]] \
    && [[ "$("$kubectl" --kubeconfig "$(e2e/lab kubeconfig east --inside)" -n shop get db orders \
      -o jsonpath='{.status.instances[*].role}' 2>/dev/null)" =~ ^(Standby ?)+$ ]]
}
east_read_write() { [[ "$(member_phase east)" == Ready ]]; }
web_moved() {
  "$kubectl" --kubeconfig "$hub_kubeconfig" -n shop get rb web-deployment -o jsonpath='{.spec.clusters[*].name}' 2>/dev/null \
    | grep -vq east && web_ready
}
web_back() {
  "$kubectl" --kubeconfig "$hub_kubeconfig" -n shop get rb web-deployment -o jsonpath='{.spec.clusters[*].name}' 2>/dev/null \
    | grep -q east && web_ready
}
echo
wait_until "orders Ready across the members" 120 db_ready
wait_until "web 6/6 ready across the members" 60 web_ready

show() {
  echo
  echo "================ $1"
  echo "== clusters (bulkhead get clusters)"
  "$bulkhead" get clusters --kubeconfig "$hub_kubeconfig" 2>/dev/null || echo "(hub unreachable)"
  echo "== bindings: the decision and each cluster's state (bulkhead get bindings -n shop)"
  "$bulkhead" get bindings -n shop --kubeconfig "$hub_kubeconfig"
  echo "== MyDatabase shop/orders on the hub: $(hub_db '{.status.phase}'), $(hub_db '{.status.readyReplicas}')/$(hub_db '{.spec.replicas}') ready"
  hub_db '{range .status.clusters[*]}  {.name}: {.readyReplicas}/{.replicas} ready, phase {.phase}, readOnly {.readOnly}, fenced {.fenced}{"\n"}{end}'
  echo "== MyDatabase shop/orders in each member (read inside the member's zone)"
  for member in east west north; do
    printf '  %-6s %s\n' "$member" "$(member_phase "$member" || true)"
  done
}
show "before: every member healthy"

# Real PostgreSQL: each member's database node runs the pods' `bulkhead instance` and
# PostgreSQL as host processes (docs/lab.md). A client writes through east's -rw Service.
sql() {
  # sql MEMBER SERVICE [--inside] STATEMENTS: psql against a database Service of a member.
  local member="$1" service="$2"; shift 2
  local inside=()
  if [[ "${1:-}" == --inside ]]; then inside=(--inside); shift; fi
  local url
  url="$(RUST_BACKTRACE=0 e2e/lab db-url "$member" shop "$service" "${inside[@]}" 2>&1)" || { echo "  (${url#Error: })"; return 0; }
  PGCONNECT_TIMEOUT=3 psql "$url" -X -q -v VERBOSITY=verbose -c "$1" 2>&1 | sed 's/^/  /' || true
}
echo
echo "== psql through east's orders-rw (from outside the zone): a write and a read"
sql east orders-rw "CREATE TABLE IF NOT EXISTS demo (id serial PRIMARY KEY, note text, at timestamptz DEFAULT now())"
sql east orders-rw "INSERT INTO demo (note) VALUES ('before the partition')"
sql east orders-rw "SELECT id, note FROM demo ORDER BY id"

# The partition drill: cut zone-a (east) off. East's agent fences its database
# read-only by itself; the hub marks the placement fenced and, after the policy's
# tolerationSeconds (30 s), moves web's stateless replicas to west and north. Nothing
# stateful moves. Healing brings everything back, make-before-break.
echo
echo "== e2e/lab partition east"
e2e/lab partition east
wait_until "east's agent fenced orders read-only" 30 east_read_only
wait_until "web's replicas moved off east (toleration 30 s)" 90 web_moved
show "during: east is cut off"
echo
echo "== psql inside zone-a during the partition: east's primary was demoted, the server itself refuses writes (SQLSTATE 25006)"
echo "   orders-rw: $(RUST_BACKTRACE=0 e2e/lab db-url east shop orders-rw --inside 2>&1 | sed 's/^Error: //')"
sql east orders-r --inside "SET default_transaction_read_only = off; INSERT INTO demo (note) VALUES ('during the partition')"
echo "== ... and reads are served"
sql east orders-r --inside "SELECT id, note FROM demo ORDER BY id"

# A placement change during the partition: scale the database down by one. The hub
# deletes and shrinks nothing anywhere while a cluster of a stateful placement is not
# Ready (the partition freeze, docs/failover.md); the binding says WaitingForPartition.
member_uids() {
  for member in east west north; do
    printf '  %-6s MyDatabase uid %s\n' "$member" \
      "$("$kubectl" --kubeconfig "$(e2e/lab kubeconfig "$member" --inside)" -n shop get db orders -o jsonpath='{.metadata.uid}' 2>/dev/null || echo '-')"
  done
}
orders_propagated() {
  "$kubectl" --kubeconfig "$hub_kubeconfig" -n shop get rb orders-mydatabase \
    -o jsonpath='{.status.conditions[?(@.type=="Propagated")].reason}' 2>/dev/null
}
waiting() { [[ "$(orders_propagated)" == WaitingForPartition ]]; }
applied() { [[ "$(orders_propagated)" == Applied ]] && db_ready; }
replicas_before="$(hub_db '{.spec.replicas}')"
echo
echo "== MyDatabase copies before the scale-down (uids, read inside each zone)"
member_uids
echo "== kubectl scale db orders --replicas=$((replicas_before - 1)) (on the hub, east still cut off)"
"$kubectl" --kubeconfig "$hub_kubeconfig" -n shop scale db orders --replicas="$((replicas_before - 1))"
wait_until "the binding says WaitingForPartition" 30 waiting
echo "== bulkhead get bindings -n shop (orders)"
"$bulkhead" get bindings -n shop --kubeconfig "$hub_kubeconfig" | sed -n '/orders-mydatabase/,/^shop\/web/p' | grep -v '^shop/web'
echo "== MyDatabase copies during the partition: nothing deleted"
member_uids
echo "== Events on the hub's MyDatabase"
"$kubectl" --kubeconfig "$hub_kubeconfig" -n shop get events --field-selector involvedObject.name=orders \
  -o custom-columns='REASON:.reason,MESSAGE:.message' 2>/dev/null | grep -E 'REASON|WaitingForPartition|Fenced' | tail -n 3 || true

echo
echo "== e2e/lab heal east"
e2e/lab heal east
wait_until "east's orders read-write again" 60 east_read_write
wait_until "web back on east" 60 web_back
wait_until "the scale-down completed (make-before-break)" 90 applied
show "after: healed"
echo
echo "== psql through east's orders-rw after the heal: writable again, every earlier write there"
sql east orders-rw "INSERT INTO demo (note) VALUES ('after the heal')"
sql east orders-rw "SELECT id, note FROM demo ORDER BY id"
echo "== MyDatabase copies after the heal: the change is done"
member_uids
echo "== volume claims of orders in each member: a removed copy's claims stay (released)"
printf '  %-7s %-16s %-8s %s\n' CLUSTER CLAIM STATUS RELEASED
for member in east west north; do
  "$kubectl" --kubeconfig "$(e2e/lab kubeconfig "$member" --inside)" -n shop get pvc -l example.com/database=orders \
    -o custom-columns="NAME:.metadata.name,STATUS:.status.phase,RELEASED:.metadata.labels.example\.com/released" \
    --no-headers 2>/dev/null | while read -r claim phase released; do
      printf '  %-7s %-16s %-8s %s\n' "$member" "$claim" "$phase" "${released/<none>/-}"
    done
done

# A progressive rollout (docs/rollouts.md): Deployment checkout goes east, then west, then
# north, each wave gated by a real Prometheus (Debian's) judging the error share of the
# wave's clusters at the new revision, from the demo application's metrics (e2e
# demo-app: requests by cluster and by the revision each copy holds; a copy's pod
# template says its error share). A good change rolls through; a bad one fails its first
# wave's analysis and is rolled back, the other waves never run it.
port_base="${BULKHEAD_LAB_PORT_BASE:-16400}"
app_port=$((port_base + 91)) prometheus_port=$((port_base + 90))
cargo build -q -p bulkhead-e2e --bin demo-app
start_bg demo-app "$target/debug/demo-app" --namespace shop --name checkout --port "$app_port" --lab-dir "$lab_dir/"
mkdir -p "$lab_dir/prometheus"
cat >"$lab_dir/prometheus.yml" <<YAML
global: {scrape_interval: 1s, evaluation_interval: 1s}
scrape_configs:
- job_name: demo
  static_configs: [{targets: ['127.0.0.1:$app_port']}]
YAML
start_bg prometheus prometheus --config.file="$lab_dir/prometheus.yml" \
  --storage.tsdb.path="$lab_dir/prometheus" --web.listen-address="127.0.0.1:$prometheus_port" --log.level=warn
prometheus_ready() { curl -sf "http://127.0.0.1:$prometheus_port/-/ready" >/dev/null; }
wait_until "Prometheus ready" 60 prometheus_ready
# checkout IMAGE ERROR_SHARE BUILD: a change of BUILD is a new revision, so every run of
# the demo rolls its changes out again (a content seen before is that revision again).
checkout() {
  cat <<YAML
apiVersion: apps/v1
kind: Deployment
metadata: {name: checkout, namespace: shop, labels: {app: checkout}}
spec:
  replicas: 2
  selector: {matchLabels: {app: checkout}}
  template:
    metadata: {labels: {app: checkout}}
    spec:
      containers:
      - name: checkout
        image: $1
        env: [{name: DEMO_ERROR_RATE, value: "$2"}, {name: DEMO_LATENCY_SECONDS, value: "0.02"},
              {name: DEMO_BUILD, value: "$3"}]
YAML
}
"$kubectl" --kubeconfig "$hub_kubeconfig" apply -f - >/dev/null <<YAML
apiVersion: federation.example.com/v1alpha1
kind: PropagationPolicy
metadata: {name: checkout, namespace: shop}
spec:
  resourceSelectors: [{apiVersion: apps/v1, kind: Deployment, name: checkout}]
  placement: {replicaScheduling: {type: Duplicated}}
  rollout:
    waves: [{name: canary, clusters: [east]}, {clusters: [west]}]
    minHealthySeconds: 8
    analysis:
      prometheus: http://127.0.0.1:$prometheus_port
      intervalSeconds: 3
      count: 3
      failureLimit: 1
      metrics:
      - name: error-rate
        query: sum(rate(demo_requests_total{cluster=~"{{clusters}}",revision="{{revision}}",code="500"}[10s])) / sum(rate(demo_requests_total{cluster=~"{{clusters}}",revision="{{revision}}"}[10s]))
        successCondition: result < 0.05
YAML
rollout_field() {
  "$kubectl" --kubeconfig "$hub_kubeconfig" -n shop get rb checkout-deployment -o jsonpath="$1" 2>/dev/null
}
rollout_completed() { [[ "$(rollout_field '{.status.rollout.phase}')" == Completed ]]; }
rollout_moved_from() { local now; now="$(rollout_field '{.status.rollout.revision}')"; [[ -n "$now" && "$now" != "$1" ]]; }
rollout() { "$bulkhead" rollout "$@" deployment/checkout -n shop --kubeconfig "$hub_kubeconfig"; }
# The first revision goes everywhere at once (a re-run of the demo rolls it out again).
checkout nginx:1.27 0 base | "$kubectl" --kubeconfig "$hub_kubeconfig" apply -f - >/dev/null
wait_until "checkout's base revision everywhere" 180 rollout_completed
build="$(date +%s)"
echo
echo "== a good change (nginx:1.28): bulkhead rollout status deployment/checkout -n shop --watch"
before="$(rollout_field '{.status.rollout.revision}')"
checkout nginx:1.28 0 "$build" | "$kubectl" --kubeconfig "$hub_kubeconfig" apply -f - >/dev/null
wait_until "the hub took the new revision" 30 rollout_moved_from "$before"
rollout status --watch || true
echo
echo "== a bad change (half of its requests fail): the canary's analysis fails, it is rolled back"
before="$(rollout_field '{.status.rollout.revision}')"
checkout nginx:1.29 0.5 "$build" | "$kubectl" --kubeconfig "$hub_kubeconfig" apply -f - >/dev/null
wait_until "the hub took the new revision" 30 rollout_moved_from "$before"
rollout status --watch || true
echo
echo "== bulkhead rollout history deployment/checkout -n shop"
rollout history || true

# One database across zones (docs/mydatabase.md, "Replica clusters set up by the hub"):
# ledger's primary cluster is east (first in its policy; on a re-run, wherever the last
# run left it), west's copy is a replica cluster streaming from it; a planned switchover
# then moves the primary to the other cluster.
cat >"$lab_dir/demo-ledger.yaml" <<'YAML'
apiVersion: federation.example.com/v1alpha1
kind: PropagationPolicy
metadata: {name: ledger, namespace: shop}
spec:
  resourceSelectors: [{apiVersion: example.com/v1, kind: MyDatabase, name: ledger}]
  placement:
    clusterAffinity: {clusterNames: [east, west]}
    replicaScheduling: {type: Divided, divisionPreference: Weighted}
---
apiVersion: example.com/v1
kind: MyDatabase
metadata: {name: ledger, namespace: shop}
spec:
  replicas: 2
  version: "16"
  storage: {size: 1Gi}
  topology: {acrossClusters: ReplicaClusters}
YAML
"$kubectl" --kubeconfig "$hub_kubeconfig" apply -f "$lab_dir/demo-ledger.yaml" >/dev/null
ledger_hub() { "$kubectl" --kubeconfig "$hub_kubeconfig" -n shop get db ledger -o jsonpath="$1" 2>/dev/null; }
ledger_row() { ledger_hub "{.status.clusters[?(@.name==\"$1\")].$2}"; }
ledger_primary() { ledger_hub '{.status.primaryCluster}'; }
other_of() { [[ "$1" == east ]] && echo west || echo east; }
# ledger_is_replica CLUSTER: the hub's status says the cluster runs as a replica cluster
# of the recorded primary cluster, with its lag.
ledger_is_replica() {
  [[ -n "$(ledger_primary)" && "$(ledger_primary)" != "$1" && "$(ledger_row "$1" role)" == Replica \
    && -n "$(ledger_row "$1" lagBytes)" ]]
}
ledger_settled() { [[ -n "$(ledger_primary)" ]] && ledger_is_replica "$(other_of "$(ledger_primary)")"; }
echo
wait_until "ledger: one primary cluster, the other a replica cluster streaming from it" 180 ledger_settled
from="$(ledger_primary)"
to="$(other_of "$from")"
echo "== the hub's view: primary cluster $from"
for cluster in east west; do
  lag="$(ledger_row "$cluster" lagBytes)"
  printf '  %s: role %s, %s/%s ready%s\n' "$cluster" "$(ledger_row "$cluster" role)" \
    "$(ledger_row "$cluster" readyReplicas)" "$(ledger_row "$cluster" replicas)" "${lag:+, $lag bytes behind}"
done
"$bulkhead" get bindings -n shop --kubeconfig "$hub_kubeconfig" | awk '/^shop\//{on = /^shop\/ledger-mydatabase/} on'
echo "== a write in $from (ledger-rw), read in $to's replica cluster (ledger-r)"
sql "$from" ledger-rw "CREATE TABLE IF NOT EXISTS entries (id serial PRIMARY KEY, note text)"
sql "$from" ledger-rw "INSERT INTO entries (note) VALUES ('written in $from')"
sleep 1
sql "$to" ledger-r "SELECT id, note FROM entries ORDER BY id"
echo "== $to refuses writes in the server: it is a replica cluster"
sql "$to" ledger-r "SET default_transaction_read_only = off; INSERT INTO entries (note) VALUES ('written in $to')"
echo
echo "== bulkhead switchover db/ledger --to $to -n shop"
"$bulkhead" switchover db/ledger --to "$to" -n shop --kubeconfig "$hub_kubeconfig" || true
wait_until "$from follows $to" 60 ledger_is_replica "$from"
# Its instances rewind onto the new primary's history first (not ready meanwhile).
ledger_reads() { RUST_BACKTRACE=0 e2e/lab db-url "$1" shop ledger-r >/dev/null 2>&1; }
wait_until "$from serves reads again (ledger-r)" 60 ledger_reads "$from"
echo "== a write in $to now (ledger-rw), read in $from, a replica cluster of $to"
sql "$to" ledger-rw "INSERT INTO entries (note) VALUES ('written in $to after the switchover')"
sleep 1
sql "$from" ledger-r "SELECT id, note FROM entries ORDER BY id"

echo
e2e/lab status
cat <<MSG

The lab keeps running in the background.
  use it:   eval "\$(e2e/lab env)"; kubectl get mc,rb -A     (the hub)
            kubectl --kubeconfig \$(e2e/lab kubeconfig east) -n shop get db,sts,deploy
  cut off:  e2e/lab partition east; e2e/lab heal east
  hub:      target/debug/bulkhead get clusters|bindings --kubeconfig \$(e2e/lab kubeconfig hub)
  rollout:  target/debug/bulkhead rollout status deployment/checkout -n shop --kubeconfig \$(e2e/lab kubeconfig hub)
            Prometheus at http://127.0.0.1:$prometheus_port (demo_requests_total)
  logs:     $lab_dir/bulkhead-hub.log, bulkhead-agent-<member>.log, bulkhead-webhook.log
  stop it:  make lab-down (stops the lab and every Bulkhead process of the demo)
MSG
