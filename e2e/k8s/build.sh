#!/usr/bin/env bash
# Builds the lab's upstream binaries from pinned Go modules into a cache outside the
# checkout, skipping whatever is already there. Safe to re-run; prints what it does.
#
#   e2e/k8s/build.sh            build what is missing
#   e2e/k8s/build.sh --print    print the bin directory and exit
#
# Environment: BULKHEAD_CACHE (default ~/.cache/bulkhead).
set -euo pipefail

K8S_VERSION=v1.36.3
ETCD_VERSION=v3.6.5
KWOK_VERSION=v0.8.0
HELM_VERSION=v3.22.0

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="${BULKHEAD_CACHE:-$HOME/.cache/bulkhead}"
bin="$cache/k8s-$K8S_VERSION/bin"

if [[ "${1:-}" == "--print" ]]; then
  echo "$bin"
  exit 0
fi

log() { printf '[lab-build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[lab-build] error: %s\n' "$*" >&2; exit 1; }

command -v go >/dev/null 2>&1 || die "Go is not installed (needed only to build the lab's upstream binaries). Install Go >= 1.26 and re-run."
mkdir -p "$bin" "$cache/src"

export GOWORK=off CGO_ENABLED=0 GOFLAGS=-mod=mod
gomodcache="$(go env GOMODCACHE)"

check_proxy() {
  # A cheap request that fails fast without a module proxy.
  if ! go mod download -json "k8s.io/kubernetes@$K8S_VERSION" >/dev/null 2>&1; then
    die "cannot download k8s.io/kubernetes@$K8S_VERSION from the Go module proxy ($(go env GOPROXY)). Check network access to the proxy or set GOPROXY."
  fi
}

k8s_ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=36"

build_kubernetes() {
  local missing=()
  for b in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    [[ -x "$bin/$b" ]] || missing+=("$b")
  done
  if [[ ${#missing[@]} -eq 0 ]]; then
    log "kubernetes $K8S_VERSION: cached"
    return
  fi
  check_proxy
  local src="$cache/src/kubernetes-$K8S_VERSION"
  mkdir -p "$src"
  cp "$here/kubernetes/go.mod" "$here/kubernetes/go.sum" "$here/kubernetes/tools.go" "$src/"
  for b in "${missing[@]}"; do
    local pkg="k8s.io/kubernetes/cmd/$b"
    [[ "$b" == kubectl ]] && pkg="k8s.io/kubernetes/cmd/kubectl"
    log "building $b $K8S_VERSION (a few minutes cold, about 2 GiB of memory)"
    (cd "$src" && go build -trimpath -ldflags "$k8s_ldflags" -o "$bin/$b.tmp" "$pkg") \
      || die "building $b failed; see the output above"
    mv "$bin/$b.tmp" "$bin/$b"
  done
}

build_etcd() {
  if [[ -x "$bin/etcd" ]]; then log "etcd $ETCD_VERSION: cached"; return; fi
  check_proxy
  local src="$cache/src/etcd-$ETCD_VERSION"
  mkdir -p "$src"
  cp "$here/etcd/go.mod" "$here/etcd/go.sum" "$here/etcd/tools.go" "$src/"
  log "building etcd $ETCD_VERSION"
  (cd "$src" && go build -trimpath -ldflags "-s -w" -o "$bin/etcd.tmp" go.etcd.io/etcd/server/v3) \
    || die "building etcd failed; see the output above"
  mv "$bin/etcd.tmp" "$bin/etcd"
}

build_kwok() {
  if [[ ! -x "$bin/kwok" ]]; then
    check_proxy
    log "building kwok $KWOK_VERSION"
    GOBIN="$bin" GOFLAGS= go install "sigs.k8s.io/kwok/cmd/kwok@$KWOK_VERSION" \
      || die "building kwok failed; see the output above"
  else
    log "kwok $KWOK_VERSION: cached"
  fi
  # kwok v0.8 ships no built-in stages; assemble the ones the lab needs from its module.
  local stages="$gomodcache/sigs.k8s.io/kwok@$KWOK_VERSION/kustomize/stage"
  if [[ ! -d "$stages" ]]; then
    GOFLAGS= go mod download "sigs.k8s.io/kwok@$KWOK_VERSION" || die "cannot download the kwok module for its stage files"
  fi
  local out="$bin/../kwok-stages.yaml"
  if [[ ! -s "$out" ]]; then
    local first=1
    : >"$out.tmp"
    for f in node/fast/node-initialize.yaml node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
             pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml \
             volume/fast/pv-bind.yaml volume/fast/pv-delete.yaml volume/fast/pvc-provision.yaml \
             volume/fast/pvc-delete.yaml; do
      [[ -f "$stages/$f" ]] || die "kwok stage $f missing in $stages"
      [[ $first -eq 1 ]] || echo '---' >>"$out.tmp"
      first=0
      cat "$stages/$f" >>"$out.tmp"
      echo >>"$out.tmp"
    done
    mv "$out.tmp" "$out"
    cp "$stages/volume/fast/storage-class.yaml" "$bin/../kwok-storage-class.yaml"
    log "kwok stages written to $out"
  fi
}

build_helm() {
  if [[ -x "$bin/helm" ]]; then log "helm $HELM_VERSION: cached"; return; fi
  check_proxy
  log "building helm $HELM_VERSION"
  GOBIN="$bin" GOFLAGS= go install "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" \
    || die "building helm failed; see the output above"
}

start=$(date +%s)
build_etcd
build_kubernetes
build_kwok
build_helm
log "all lab binaries ready in $bin ($(( $(date +%s) - start )) s)"
