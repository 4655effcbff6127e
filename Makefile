# Bulkhead developer entry points. `make demo` and `make test` are the README quick start.
SHELL := /bin/bash
CARGO ?= cargo
LAB := e2e/lab
CHART := charts/bulkhead
HELM = $(shell e2e/k8s/build.sh --print)/helm

.PHONY: demo test lint fmt crds crd-check chart-lint unit e2e chaos chaos-short setup lab-binaries lab-up lab-down build bench bench-lab

## demo: bring up the lab (hub + 3 members), install Bulkhead and show placement and health
demo: lab-binaries
	e2e/demo.sh

## test: everything CI checks: formatting, clippy, CRD drift, unit tests, chart lint, e2e tests on the
## lab, and a short chaos run (CHAOS_TEST_SECONDS, default 120 s, a random seed it prints)
test: lint crd-check unit chart-lint e2e chaos-short

## lint: rustfmt check and clippy with warnings as errors
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## crds: regenerate config/crd/ from src/api/ (and the chart's copies)
crds:
	$(CARGO) run -q -- crd --output-dir config/crd
	$(CARGO) run -q -- crd --output-dir $(CHART)/files/crds

## crd-check: fail when config/crd/ or the chart's CRDs drifted from the code
crd-check:
	$(CARGO) run -q -- crd --check config/crd
	$(CARGO) run -q -- crd --check $(CHART)/files/crds

## chart-lint: helm lint of the chart with its default and its full values (helm from the lab's binaries)
chart-lint: lab-binaries
	$(HELM) lint --strict $(CHART)
	$(HELM) lint --strict $(CHART) -f $(CHART)/ci/full-values.yaml
	$(HELM) template bulkhead $(CHART) -n bulkhead-system >/dev/null
	$(HELM) template bulkhead $(CHART) -n bulkhead-system -f $(CHART)/ci/full-values.yaml >/dev/null

## unit: unit tests, and the crate's integration tests (tests/instance.rs runs real PostgreSQL,
## which e2e/setup.sh installs when it is missing)
unit: setup
	$(CARGO) test --workspace --lib --bins
	$(CARGO) test -p bulkhead --test '*'

## e2e: the end-to-end tests against the lab's real control planes (builds the lab binaries on first use)
e2e: lab-binaries
	e2e/run-e2e.sh

## chaos: a seeded schedule of faults (partitions, the hub isolated, leader killed or frozen, member
## API servers restarted) and user operations on a lab of its own, then the audit-log safety check
## and the convergence check; CHAOS_SECONDS (default 180) and CHAOS_SEED (default random) choose
## the schedule. See docs/chaos.md
CHAOS_SECONDS ?= 180
CHAOS_SEED ?=
chaos: lab-binaries
	CHAOS_SECONDS=$(CHAOS_SECONDS) CHAOS_SEED=$(CHAOS_SEED) e2e/run-chaos.sh

## chaos-short: the chaos run `make test` makes: CHAOS_TEST_SECONDS (default 120) of faults, the seed
## CHAOS_SEED when set, else a random one (printed with the command that reproduces it)
CHAOS_TEST_SECONDS ?= 120
chaos-short: lab-binaries
	CHAOS_SECONDS=$(CHAOS_TEST_SECONDS) CHAOS_SEED=$(CHAOS_SEED) e2e/run-chaos.sh

build:
	$(CARGO) build --workspace

setup:
	e2e/setup.sh

lab-binaries: setup
	e2e/k8s/build.sh

lab-up: lab-binaries
	$(LAB) up

lab-down:
	$(LAB) down

## bench: the placement kernel benchmark (prints decisions per second; see docs/placement.md)
bench:
	$(CARGO) bench --bench placement -- --warm-up-time 1 --measurement-time 3

## bench-lab: the propagation budgets (DESIGN.md section 9, issue 14) measured on the lab with a
## release hub: a burst of 500 Deployments (6 replicas, weights 3:2:1, 4 create clients), 100
## replica changes, then 5,000 templates for the cold start and 10,000 for memory; then a flood
## of the hub's webhook (2,000 slow connections, 4 MiB reviews). Prints the
## numbers as Markdown rows; see docs/benchmarks.md (sizes: BULKHEAD_BENCH_TEMPLATES,
## BULKHEAD_BENCH_COLD_TEMPLATES, BULKHEAD_BENCH_MEMORY_TEMPLATES, BULKHEAD_BENCH_MEMORY_REPLICAS)
bench-lab: lab-binaries
	$(CARGO) build --release -p bulkhead --bin bulkhead
	BULKHEAD_BIN=$${CARGO_TARGET_DIR:-$(CURDIR)/target}/release/bulkhead e2e/run-e2e.sh --test scale --ignored bench_ --nocapture
	BULKHEAD_BIN=$${CARGO_TARGET_DIR:-$(CURDIR)/target}/release/bulkhead e2e/run-e2e.sh --test flood --ignored bench_ --nocapture
