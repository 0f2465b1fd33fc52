# Every target a developer or CI needs. `make test` is the one test command (README.md, .ci/run).
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
CARGO ?= cargo
# e2e tests mostly wait on the cluster; run several at once even on 2 cores.
E2E_THREADS ?= 4
# Inputs of `make fuzz` (`make unit` runs the same harness with its default of 100,000).
FUZZ_CASES ?= 1000000
# The image, named in one place; artifacts/*.yaml use the same (a test checks it).
IMAGE ?= ghcr.io/statefulset-scaledown/statefulset-scaledown-controller:0.1.0

.PHONY: test fmt-check clippy lint unit fuzz props e2e e2e-oldest e2e-faults chaos chaos-ci bench bench-report control-plane cluster-up cluster-down demo demo-ci build plugin krew image image-push release docker-image manifests deny audit

## test: formatting, lints, unit tests, e2e tests, the demo, the fault tests and a short seeded chaos
## run on the local control plane
test: fmt-check clippy lint unit e2e demo-ci e2e-faults chaos-ci

fmt-check:
	$(CARGO) fmt --all -- --check

# --all-targets leaves out the test = false targets (chaos, e2e_faults, bench): named here.
clippy:
	$(CARGO) clippy --locked --all-targets --test chaos --test e2e_faults --test bench -- -D warnings

## lint: the release workflow (.github/workflows/release.yml, which only runs on the CI host) with
## actionlint and shellcheck, and hack/release.sh with shellcheck (hack/lint.sh)
lint:
	hack/lint.sh

unit:
	$(CARGO) test --locked --lib --bins
	$(PYTHON) bench/report.py --check

## fuzz: the template parser fuzz harness with FUZZ_CASES inputs; prints the count and peak RSS
fuzz:
	FUZZ_CASES=$(FUZZ_CASES) $(CARGO) test --locked --lib template::fuzz -- --nocapture

## props: the property tests over decide with PROPS_CASES cases (`make unit` runs 100,000)
PROPS_CASES ?= 1000000
props:
	PROPS_CASES=$(PROPS_CASES) $(CARGO) test --locked --lib decide::props -- --test-threads=2

# Every tests/e2e_*.rs but the fault tests, which must run alone (`make e2e-faults`), the
# in-cluster tests, whose controllers watch every namespace, and the docs' install commands, which
# use the manifests' fixed names as tests/e2e_deploy.rs does (both run after the others, one at a time).
E2E_TESTS := $(patsubst tests/%.rs,--test %,$(filter-out tests/e2e_faults.rs tests/e2e_incluster.rs tests/e2e_docs.rs,$(sort $(wildcard tests/e2e_*.rs))))

## e2e: starts the local control plane if none runs, runs tests/e2e_*.rs (but e2e_faults), then
## tests/e2e_incluster.rs and tests/e2e_docs.rs alone, stops what it started (builds the image first: tests/e2e_image.rs
## runs it, tests/e2e_incluster.rs starts it on the real node; the previous version for
## tests/e2e_upgrade.rs; and krew for tests/e2e_krew.rs)
e2e: image
	$(CARGO) build --locked --bins --tests
	hack/build-previous.sh >/dev/null
	hack/build-tools.sh krew >/dev/null
	hack/build-tools.sh cosign >/dev/null
	hack/with-cluster.sh bash -c '$(CARGO) test --locked $(E2E_TESTS) -- --test-threads=$(E2E_THREADS) \
	  && $(CARGO) test --locked --test e2e_incluster --test e2e_docs -- --test-threads=1'

## e2e-oldest: the controller's e2e tests (not the image, chart, deploy and fault tests) on the oldest
## supported Kubernetes, OLDEST_K8S, built into the cache on first use (about 10 minutes). Not part of
## `make test`; run it with no other cluster up in this checkout.
OLDEST_K8S ?= v1.34.4
E2E_OLDEST := $(patsubst tests/%.rs,--test %,$(filter-out tests/e2e_faults.rs tests/e2e_image.rs tests/e2e_incluster.rs \
  tests/e2e_chart.rs tests/e2e_deploy.rs tests/e2e_docs.rs tests/e2e_release.rs,$(sort $(wildcard tests/e2e_*.rs))))
e2e-oldest:
	$(CARGO) build --locked --bins --tests
	hack/build-previous.sh >/dev/null
	SCALEDOWN_REAL_NODE=0 SCALEDOWN_K8S_VERSION=$(OLDEST_K8S) hack/with-cluster.sh $(CARGO) test --locked $(E2E_OLDEST) -- --test-threads=$(E2E_THREADS)

## e2e-faults: tests/e2e_faults.rs (API server restarts, SIGTERM in every state, leader churn), one
## test at a time. It restarts kube-apiserver: do not run it beside other tests on one cluster.
e2e-faults:
	$(CARGO) build --locked --bins --test e2e_faults
	SCALEDOWN_REAL_NODE=0 hack/with-cluster.sh $(CARGO) test --locked --test e2e_faults -- --test-threads=1

## chaos: seeded chaos rounds with an invariant checker (tests/chaos.rs) on the local control plane,
## each under a perturbation of the controllers' views (Sieve proxies: a watch delayed or coalesced,
## or a SIGKILL right after the n-th write of a kind), printed per round and counted at the end;
## the same SEED replays the same perturbations and actions. Do not run it beside other e2e tests on one cluster: its
## controllers watch every namespace.
ROUNDS ?= 20
SEED ?= $(shell date +%s)
chaos:
	$(CARGO) build --locked --bins --test chaos
	SCALEDOWN_REAL_NODE=0 hack/with-cluster.sh $(CARGO) test --locked --test chaos -- --rounds $(ROUNDS) --seed $(SEED)

## chaos-ci: a few chaos rounds with a fixed seed, for `make test` (seed 42: the pod watch delayed
## 1.5, 2 and 3 s, forged pods, SIGKILLs, scale to zero and back; no API server restart, see `make chaos`)
chaos-ci:
	$(MAKE) chaos ROUNDS=3 SEED=42

## bench: the benchmark (tests/bench.rs, release build) on the local control plane, one scenario
## after another, each on a fresh cluster unless one is already up; then bench-report. Long (see
## BENCHMARKS.md for how long each took); not part of `make test`.
##   make bench                         all scenarios (single sets20 sets500 idle), seed 42
##   make bench SCENARIO=sets500 SEED=7 SETS=200 BENCH_ARGS='--cleanup-seconds 0'
##   make bench SCENARIO=podbound       one not in the default list (also corpus, sets5000)
##   make bench SCENARIO=realnode       on the real node (hack/real-node.sh), which this one starts with
##                                      the cluster; fails if it cannot (the others run on KWOK only)
SCENARIO ?= all
BENCH_SCENARIOS := $(if $(filter all,$(SCENARIO)),single sets20 sets500 idle,$(SCENARIO))
# SEED defaults to the clock for chaos; the bench is reproducible unless asked otherwise.
BENCH_SEED := $(if $(filter command line environment,$(origin SEED)),$(SEED),42)
BENCH_ARGS ?=
PYTHON ?= python3
bench:
	$(CARGO) test --locked --release --test bench --no-run
	failed=0; for s in $(BENCH_SCENARIOS); do \
	  real=0; [ "$$s" != realnode ] || real=1; \
	  BENCH_COMMAND="make bench SCENARIO=$$s SEED=$(BENCH_SEED)$(if $(SETS), SETS=$(SETS))$(if $(BENCH_ARGS), BENCH_ARGS='$(BENCH_ARGS)')" \
	    SCALEDOWN_REAL_NODE=$$real hack/with-cluster.sh $(CARGO) test --locked --release --test bench -- --scenario $$s --seed $(BENCH_SEED) \
	    $(if $(SETS),--sets $(SETS)) $(BENCH_ARGS) || failed=1; \
	done; $(MAKE) bench-report; exit $$failed

## bench-report: BENCHMARKS.md and bench/plots/ from bench/results/*.json (installs matplotlib if missing)
bench-report:
	$(PYTHON) -c 'import matplotlib' 2>/dev/null || $(PYTHON) -m pip install --quiet matplotlib \
	  || { apt-get update -qq && apt-get install -y -qq python3-matplotlib; }
	$(PYTHON) bench/report.py

build:
	$(CARGO) build --locked --release

## plugin: the kubectl plugin, target/release/kubectl-scaledown (put it on PATH: `kubectl scaledown`)
plugin:
	$(CARGO) build --locked --release --bin kubectl-scaledown
	@echo "plugin: $(CURDIR)/target/release/kubectl-scaledown"

## krew: the plugin as a Krew release in target/krew/: kubectl-scaledown_vVERSION_OS_ARCH.tar.gz (the
## static release build and LICENSE) and the plugin manifest scaledown.yaml naming it by URL
## (KREW_URI_BASE) and sha256 (hack/krew.sh). Install it from the file:
##   kubectl krew install --manifest=target/krew/scaledown.yaml --archive=target/krew/kubectl-scaledown_v0.1.0_linux_amd64.tar.gz
krew:
	hack/krew.sh

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

## cluster-up: the local control plane with three KWOK nodes and one real node (kubelet + containerd,
## hack/real-node.sh; SCALEDOWN_REAL_NODE=0 leaves it out); cluster-down stops all of it
cluster-up:
	hack/cluster.sh up

cluster-down:
	hack/cluster.sh down

## demo: the original's walk-through (datastore 3 -> 2) on the local control plane; builds only what
## it uses (the control plane and kubelet on first use, the controller; not Helm), each long step
## logged to target/build-logs/ with its progress shown; tables printed only when they change.
## `make demo APP=redis`: example/redis re-sharded 3 -> 2 on the real node, keys per shard before
## and after (hack/demo-redis.sh)
APP ?= datastore
demo:
	$(if $(filter redis,$(APP)),hack/demo-redis.sh,$(if $(filter datastore,$(APP)),hack/demo.sh,$(error APP must be datastore or redis)))

## demo-ci: both demos as `make test` runs them: on a cluster of hack/with-cluster.sh (started and
## stopped if none runs), tables printed only when they change, their namespaces and PVs removed at the
## end; fails if a walk-through takes more than DEMO_TIMEOUT seconds (180), the datastore one does not
## clean exactly once, or a key of the redis one does not read back
demo-ci:
	hack/with-cluster.sh bash -c 'hack/demo.sh --ci && hack/demo-redis.sh --ci'

## image: the OCI image in target/image/oci without a container engine (hack/image.sh): a static
## binary on an empty base, reproducible (SOURCE_DATE_EPOCH = the commit's time); prints the digest
image:
	hack/image.sh $(IMAGE)

## image-push: push target/image/oci to IMAGE's registry (crane; log in first with `crane auth login`)
image-push:
	"$$(hack/build-tools.sh crane | tail -n 1)" push target/image/oci $(IMAGE)

## release: the image (`make image`), pushed to REGISTRY with its SBOM as a signed attestation, signed
## with cosign (COSIGN_KEY and COSIGN_PASSWORD, else a key pair generated into target/signing/), and
## the chart, its image pinned by digest, pushed to oci://REGISTRY/charts and signed (hack/release.sh).
## Log in to the registry first (crane auth login, helm registry login). Docs: docs/operations.md#releases
REGISTRY ?= ghcr.io/statefulset-scaledown
release: image
	REGISTRY=$(REGISTRY) hack/release.sh

## docker-image: the same layout with a container engine (Dockerfile)
docker-image:
	docker build --build-arg GIT_COMMIT=$$(git rev-parse HEAD) \
	  --build-arg SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct) -t $(IMAGE) .
