#!/usr/bin/env bash
# Installs what a fresh Debian machine lacks for the lab: iptables (partitions), iproute2
# (the database pods' addresses), make, git, PostgreSQL's server programs and psql
# (the database instances, the demo's client) and Prometheus (the rollout analysis). `make demo`, `make e2e` and `.ci/run` call
# it; it does nothing when all are there.
set -euo pipefail
missing=()
command -v iptables >/dev/null 2>&1 || [[ -x /usr/sbin/iptables ]] || missing+=(iptables)
# `ip addr`: the lab's database pods' addresses on the loopback interface.
command -v ip >/dev/null 2>&1 || [[ -x /usr/sbin/ip ]] || missing+=(iproute2)
command -v make >/dev/null 2>&1 || missing+=(make)
command -v git >/dev/null 2>&1 || missing+=(git)
# PostgreSQL's server programs: `bulkhead instance` runs them (tests/instance.rs).
compgen -G "/usr/lib/postgresql/*/bin/postgres" >/dev/null || missing+=(postgresql)
# psql: the demo's client.
command -v psql >/dev/null 2>&1 || missing+=(postgresql-client)
# Prometheus: the rollout tests' analysis reads a real one (tests/rollouts.rs).
command -v prometheus >/dev/null 2>&1 || missing+=(prometheus)
if [[ ${#missing[@]} -gt 0 ]]; then
  if [[ $(id -u) -ne 0 ]]; then
    echo "setup: missing Debian packages: ${missing[*]}; run as root or install them: apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "[setup] installing Debian packages: ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # Without recommends: prometheus would bring node-exporter and its collectors.
  apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
