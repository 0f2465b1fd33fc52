# Every target a developer or CI needs. `make test` is the one test command (README, .ci/run).
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo
# e2e tests mostly wait on the cluster; run several at once even on 2 cores.
E2E_THREADS ?= 4
# Inputs of `make fuzz` (`make unit` runs the same harness with its default of 100,000).
FUZZ_CASES ?= 1000000
# The image, named in one place; artifacts/*.yaml use the same (a test checks it).
IMAGE ?= ghcr.io/statefulset-scaledown/statefulset-scaledown-controller:0.1.0

.PHONY: test fmt-check clippy unit fuzz e2e chaos chaos-ci control-plane cluster-up cluster-down demo build image image-push docker-image manifests deny audit

## test: formatting, lints, unit tests, e2e tests and a short seeded chaos run on the local control plane
test: fmt-check clippy unit e2e chaos-ci

fmt-check:
	$(CARGO) fmt --all -- --check

clippy:
	$(CARGO) clippy --locked --all-targets -- -D warnings

unit:
	$(CARGO) test --locked --lib --bins

## fuzz: the template parser fuzz harness with FUZZ_CASES inputs; prints the count and peak RSS
fuzz:
	FUZZ_CASES=$(FUZZ_CASES) $(CARGO) test --locked --lib template::fuzz -- --nocapture

## e2e: starts the local control plane if none runs, runs tests/e2e_*.rs, stops what it started
## (builds the image first: tests/e2e_image.rs runs it)
e2e: image
	$(CARGO) build --locked --bins --tests
	hack/with-cluster.sh $(CARGO) test --locked --test 'e2e_*' -- --test-threads=$(E2E_THREADS)

## chaos: seeded chaos rounds with an invariant checker (tests/chaos.rs) on the local control plane;
## the same SEED replays the same actions. Do not run it beside other e2e tests on one cluster: its
## controllers watch every namespace.
ROUNDS ?= 20
SEED ?= $(shell date +%s)
chaos:
	$(CARGO) build --locked --bins --test chaos
	hack/with-cluster.sh $(CARGO) test --locked --test chaos -- --rounds $(ROUNDS) --seed $(SEED)

## chaos-ci: a few chaos rounds with a fixed seed, for `make test` (seed 42: forged pods on wanted and
## orphaned ordinals, SIGKILLs and failovers; no API server restart, see `make chaos`)
chaos-ci:
	$(MAKE) chaos ROUNDS=3 SEED=42

build:
	$(CARGO) build --locked --release

## deny: licenses, bans and sources of the dependency tree (cargo-deny, deny.toml; offline)
deny:
	hack/deny.sh licenses bans sources

## audit: RustSec advisories of the locked dependencies (cargo-deny; needs the advisory database)
audit:
	hack/deny.sh advisories

## manifests: render artifacts/*.yaml from the Helm chart (tests/e2e_chart.rs checks they match)
manifests:
	hack/manifests.sh

## control-plane: build (or reuse) the cached Kubernetes, KWOK and etcd binaries
control-plane:
	hack/build-control-plane.sh

cluster-up:
	hack/cluster.sh up

cluster-down:
	hack/cluster.sh down

## demo: the original's walk-through (datastore 3 -> 2) on the local control plane
demo:
	hack/demo.sh

## image: the OCI image in target/image/oci without a container engine (hack/image.sh): a static
## binary on an empty base, reproducible (SOURCE_DATE_EPOCH = the commit's time); prints the digest
image:
	hack/image.sh $(IMAGE)

## image-push: push target/image/oci to IMAGE's registry (crane; log in first with `crane auth login`)
image-push:
	"$$(hack/build-tools.sh crane | tail -n 1)" push target/image/oci $(IMAGE)

## docker-image: the same layout with a container engine (Dockerfile)
docker-image:
	docker build --build-arg GIT_COMMIT=$$(git rev-parse HEAD) \
	  --build-arg SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct) -t $(IMAGE) .
