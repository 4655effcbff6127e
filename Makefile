# Bulkhead developer entry points. `make demo` and `make test` are the README quick start.
SHELL := /bin/bash
CARGO ?= cargo
LAB := e2e/lab

.PHONY: demo test lint fmt crds crd-check unit e2e lab-binaries lab-up lab-down build bench bench-lab

## demo: bring up the lab (hub + 3 members), install Bulkhead and show placement and health
demo: lab-binaries
	e2e/demo.sh

## test: everything CI checks: formatting, clippy, CRD drift, unit tests, e2e tests on the lab
test: lint crd-check unit e2e

## lint: rustfmt check and clippy with warnings as errors
lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## crds: regenerate config/crd/ from src/api/
crds:
	$(CARGO) run -q -- crd --output-dir config/crd

## crd-check: fail when config/crd/ drifted from the code
crd-check:
	$(CARGO) run -q -- crd --check config/crd

unit:
	$(CARGO) test --workspace --lib --bins
	$(CARGO) test -p bulkhead --test '*'

## e2e: the end-to-end tests against the lab's real control planes (builds the lab binaries on first use)
e2e: lab-binaries
	e2e/run-e2e.sh

build:
	$(CARGO) build --workspace

lab-binaries:
	e2e/setup.sh
	e2e/k8s/build.sh

lab-up: lab-binaries
	$(LAB) up

lab-down:
	$(LAB) down

## bench: the placement kernel benchmark (prints decisions per second; see docs/placement.md)
bench:
	$(CARGO) bench --bench placement -- --warm-up-time 1 --measurement-time 3

## bench-lab: the propagation budgets measured on the lab (burst of 500 Deployments, 100
## replica changes, hub cold start; prints numbers; see docs/placement.md)
bench-lab: lab-binaries
	$(CARGO) build --release -p bulkhead --bin bulkhead
	BULKHEAD_BIN=$(CURDIR)/target/release/bulkhead e2e/run-e2e.sh --ignored bench_ --nocapture
