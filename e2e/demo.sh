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
echo
e2e/lab status
cat <<MSG

The lab keeps running in the background.
  use it:   eval "\$(e2e/lab env)"; kubectl get mc     (the hub)
            kubectl --kubeconfig \$(e2e/lab kubeconfig east) get nodes
  cut off:  e2e/lab partition east; e2e/lab heal east
  stop it:  make lab-down
The hub, agents and sample policies join the demo as their issues land (see README).
MSG
