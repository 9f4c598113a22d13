# HeteroTrain — the two commands:   make demo   |   make test
# Everything is installed or built on first use and cached in $(HETEROTRAIN_CACHE).

SHELL := /bin/bash
.SHELLFLAGS := -eo pipefail -c
HETEROTRAIN_CACHE ?= $(HOME)/.cache/heterotrain
export HETEROTRAIN_CACHE
CARGO_TARGET_DIR ?= $(HETEROTRAIN_CACHE)/target
export CARGO_TARGET_DIR
ENV := source $(HETEROTRAIN_CACHE)/env.sh &&
CARGO := $(ENV) cargo

.PHONY: help setup test chaos fuzz lint fmt crds demo demo-down build bench bench-balancer bench-trainer wheel clean-cache install-plugin plugin-krew images

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/' | column -t -s $$'\t'

setup: ## install/build everything needed (idempotent; cached in $(HETEROTRAIN_CACHE))
	@bash e2e/scripts/setup.sh

build: setup ## build all binaries (release)
	@echo "==> cargo build --release --workspace"
	@$(CARGO) build --release --workspace

lint: setup ## cargo fmt --check and clippy -D warnings
	@echo "==> cargo fmt --check"
	@$(CARGO) fmt --all -- --check
	@echo "==> cargo clippy --all-targets -- -D warnings"
	@$(CARGO) clippy --workspace --all-targets -- -D warnings

test: setup ## formatting, lints and every test (unit, real API server, real c10d, the Python library), in parallel lanes; prints the slowest
	@bash e2e/scripts/test.sh

WHEEL_DIR ?= $(CARGO_TARGET_DIR)/wheels

wheel: setup ## build the Python library's wheel (heterotrain-<version>-py3-none-any.whl) into $(WHEEL_DIR)
	@bash trainer-image/python/build-wheel.sh "$(HETEROTRAIN_CACHE)/venv/bin/python" "$(WHEEL_DIR)"

CHAOS_KILLS ?= 20

chaos: setup ## the chaos suite on the local control plane: $(CHAOS_KILLS) rank kills, a hung rank, a lost node, … (table in $(HETEROTRAIN_CACHE)/results/chaos.md)
	@echo "==> chaos: $(CHAOS_KILLS) kills (cargo test -p heterotrain-e2e --test chaos)"
	@$(ENV) HETEROTRAIN_CHAOS_KILLS=$(CHAOS_KILLS) cargo test -p heterotrain-e2e --test chaos -- --nocapture
	@echo "==> chaos: every case passed; table: $(HETEROTRAIN_CACHE)/results/chaos.md"

FUZZ_CASES ?= 1000000

fuzz: setup ## fuzz the plan parser, the exposition parser and spec validation, $(FUZZ_CASES) inputs each (release)
	@echo "==> fuzz: $(FUZZ_CASES) generated inputs per target (cargo test --release … fuzz_)"
	@$(ENV) HETEROTRAIN_FUZZ_CASES=$(FUZZ_CASES) cargo test --release -p heterotrain-crds -p heterotrain-operator --lib fuzz_ -- --test-threads=2
	@echo "==> fuzzing found no panic"

fmt: ## format the code
	@cargo fmt --all

crds: ## regenerate crds/heterotrainingjob.yaml (and the chart's copy) and docs/api-reference.md from the Rust types
	@$(CARGO) run -q -p heterotrain-crds --bin crdgen > crds/heterotrainingjob.yaml.tmp
	@mv crds/heterotrainingjob.yaml.tmp crds/heterotrainingjob.yaml
	@cp crds/heterotrainingjob.yaml charts/heterotrain/crds/heterotrainingjob.yaml
	@$(CARGO) run -q -p heterotrain-crds --bin crdgen -- --reference > docs/api-reference.md.tmp
	@mv docs/api-reference.md.tmp docs/api-reference.md
	@echo "wrote crds/heterotrainingjob.yaml, charts/heterotrain/crds/heterotrainingjob.yaml and docs/api-reference.md"

demo: setup ## the whole system on this machine (see README)
	@bash e2e/scripts/release.sh heterotrain-demo

DEMO_BIN := $(CARGO_TARGET_DIR)/release/heterotrain-demo

demo-down: ## stop the demo's local control plane (runs the demo's own binary: compiles nothing)
	@if [ -x "$(DEMO_BIN)" ]; then "$(DEMO_BIN)" --down; \
	else echo "no demo binary at $(DEMO_BIN): make demo has not run here, so there is nothing to stop"; fi

bench: setup ## policies × scenarios on simulated nodes, DDP, operator scale → out/bench (BENCH_ARGS=--quick …)
	@bash e2e/scripts/release.sh heterotrain-bench $(BENCH_ARGS)

bench-balancer: setup ## balancer efficiency per policy and plan time at scale
	@$(CARGO) run -q --release -p heterotrain-balancer --bin heterotrain-bench-balancer

bench-trainer: setup ## our trainer vs PyTorch DDP (torchrun, Gloo), 2 ranks
	@$(ENV) bash trainer-image/scripts/bench_trainer.sh

clean-cache: ## remove build outputs from the cache (keeps downloads and the venv)
	rm -rf $(HETEROTRAIN_CACHE)/target

install-plugin: setup ## build kubectl-heterotrain and put it on the cache's bin (on PATH via env.sh)
	@$(CARGO) build -q --release -p kubectl-heterotrain
	@ln -sf $(CARGO_TARGET_DIR)/release/kubectl-heterotrain $(HETEROTRAIN_CACHE)/bin/kubectl-heterotrain
	@echo "installed: $(HETEROTRAIN_CACHE)/bin/kubectl-heterotrain (source $(HETEROTRAIN_CACHE)/env.sh, then: kubectl heterotrain --help)"

plugin-krew: setup ## package the kubectl plugin for krew: archive + manifest in out/krew (BASE_URL=where the archive will be published)
	@$(ENV) bash operator/kubectl-plugin/krew/release.sh out/krew $(BASE_URL)

images: setup ## build the operator and trainer images from scratch (buildah, no daemon) as OCI archives in out/images (IMAGES="operator" for one)
	@$(ENV) bash e2e/scripts/images.sh $(IMAGES)
