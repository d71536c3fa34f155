# attach-detach-controller
#
#   make demo         run the controller's job on an embedded local cluster
#   make test         unit tests, every Go benchmark once, simulation,
#                     integration tests against a real kube-apiserver,
#                     end-to-end, the small sets on real kubelets (hollow
#                     nodes) and in a whole cluster, and a short chaos run
#   make test-hollow-full  every scenario on real kubelets, with this
#                     controller and with kube-controller-manager's
#   make test-cluster-full  StatefulSets in a whole cluster (scheduler,
#                     kube-controller-manager, provisioner, zones), a node
#                     stopped and a zone cut off, with this controller and
#                     with kube-controller-manager's
#   make bench-cluster  StatefulSets scaled and a node drained in a whole
#                     cluster, this controller and kube-controller-manager's
#                     attachdetach side by side (not in make test)
#   make verify       gofmt, go vet, staticcheck, module and version pins,
#                     the Dockerfile, the manifests and the Helm chart
#   make kubectl-adc  the kubectl plugin (kubectl adc why pod/NAME)
#   make test-skew    integration and end-to-end tests against every
#                     supported kube-apiserver release (not in make test)
#   make sim-sweep    the simulation's long sweep of world configurations:
#                     200,000 seeds, violations tallied by invariant, shape
#                     and configuration (not in make test)
#   make test-guard-soak  5 minutes of attaches and detaches beside
#                     kube-controller-manager --controllers=*,-attachdetach:
#                     the guard reports nothing (20 s of it in make test)

SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

# Every go command builds the way the image and the tools do (CGO off,
# -trimpath): the packages go vet, staticcheck, the tests, the controller and
# hack/tools share (client-go, apiserver, ...; hack/tools/go.mod holds them at
# the same versions, hack/verify-shared-modules.sh checks it) compile once on
# a cold cache. Only the race detector's build (cgo) is one of its own.
export CGO_ENABLED := 0
# Test binaries and go run link without DWARF (-w): a fifth less link time,
# stack traces and race reports unchanged; make build's own -ldflags keep it.
export GOFLAGS     := $(strip $(filter-out -trimpath -ldflags=-w,$(GOFLAGS)) -trimpath -ldflags=-w)

BIN_DIR     := _output/bin
# The release is in VERSION, the one place it is written: the image tag, the
# chart's version and appVersion (hack/verify-chart.sh checks them) and the
# version a build of the release's tag prints; a build of any other commit
# prints the release, -dev and the commit (hack/version.sh).
VERSION     ?= $(shell hack/version.sh)
LDFLAGS     := -X github.com/kube-attach/attach-detach-controller/cmd/attach-detach-controller/app.Version=$(VERSION)
PLUGIN_LDFLAGS := -X github.com/kube-attach/attach-detach-controller/cmd/kubectl-adc/app.Version=$(VERSION)
GO_TEST     ?= go test
# go test's own vet (a subset of go vet's checks, once per build
# configuration) is left to make verify, which runs go vet on every package
# and its tests.
TEST_FLAGS  ?= -count=1 -vet=off
STATICCHECK := honnef.co/go/tools/cmd/staticcheck@v0.8.2

# The stack `make demo` and `make test-e2e` run (test/e2e/stack); hollow-node
# is the real kubelet the demo and test/hollow run.
E2E_TOOLS := etcd kube-apiserver csi-attacher csi-mock-driver hollow-node
# A whole cluster (test/cluster, make demo): the e2e stack, kube-scheduler,
# kube-controller-manager and the CSI external-provisioner.
CLUSTER_TOOLS := $(E2E_TOOLS) kube-controller-manager kube-scheduler csi-provisioner
# Every tool `make test` runs, built by one `go build` (hack/build-tools.sh):
# the integration tests' kube-controller-manager and kustomize (which renders
# manifests/, as `kubectl kustomize` would), and the cluster's.
TOOLS := $(CLUSTER_TOOLS) kustomize

.PHONY: all build kubectl-adc kubectl-adc-release tools go-tools helm promtool test-binaries test test-unit test-bench test-sim sim-sweep test-integration test-integration-rest test-integration-waits test-e2e test-hollow test-hollow-full test-cluster test-cluster-full test-chaos test-skew test-guard-soak chaos chaos-hollow demo bench bench-hollow verify image clean

all: build

build:
	CGO_ENABLED=0 go build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN_DIR)/attach-detach-controller ./cmd/attach-detach-controller

# The kubectl plugin: copy it onto the PATH, then `kubectl adc why pod/NAME`.
# make kubectl-adc-release: an archive per platform and the krew manifest
# (plugins/adc.yaml, filled in) in _output/release.
kubectl-adc:
	CGO_ENABLED=0 go build -trimpath -ldflags '$(PLUGIN_LDFLAGS)' -o $(BIN_DIR)/kubectl-adc ./cmd/kubectl-adc

kubectl-adc-release:
	hack/release-kubectl-adc.sh $(VERSION)

# The real etcd and kube-apiserver the integration tests run against, built
# from the Go module proxy (hack/tools); a second run reuses them. promtool
# installs and helm (hack/helm, a module of its own) builds beside them
# (make -j).
tools: go-tools promtool helm

go-tools:
	hack/build-tools.sh $(TOOLS)

helm:
	hack/build-helm.sh

promtool:
	hack/install-promtool.sh

# The tests against the real stack mostly wait on the API server and timers:
# they run side by side with each other and with the unit tests and the
# simulation, which compute (each target's output is printed whole when it
# ends).
test:
	$(MAKE) --no-print-directory --output-sync=target -j 5 test-unit test-bench test-sim test-integration test-e2e test-hollow test-cluster test-chaos

# The race detector builds every dependency again (cgo, instrumented): it runs
# the packages that have tests. The others (pkg/server, the command's main
# package) would only be compiled here, and k8s.io/apiserver's serving stack
# with them; go vet, staticcheck and make build compile them, and the secure
# endpoint is tested on the real stack (test/integration).
RACE_PACKAGES = $(shell go list -f '{{if or .TestGoFiles .XTestGoFiles}}{{.ImportPath}}{{end}}' ./pkg/... ./cmd/...)
# It compiles this module and its dependencies without optimisation (-N -l;
# the standard library keeps its optimised build: std=): a third less
# compile time for the same checks (the detector instruments every memory
# access either way; unoptimised, none is kept in a register).
RACE_GCFLAGS := -gcflags='all=-N -l' -gcflags='std='

test-unit:
	CGO_ENABLED=1 $(GO_TEST) $(TEST_FLAGS) -race $(RACE_GCFLAGS) $(RACE_PACKAGES)

# Every Go benchmark once (-short: the controller's cost benchmarks at their
# smallest size), without the race detector: a benchmark checks what it
# measures (the writes an event must make, the decision it must reach), and
# a check that no longer holds fails here, not in a later make bench.
test-bench:
	$(GO_TEST) $(TEST_FLAGS) -short -run '^$$' -bench . -benchtime=1x ./pkg/cache ./pkg/reconciler ./pkg/controller

# The deterministic simulation (test/sim): a short sweep, SIM_SEEDS seeds from
# SIM_FIRST_SEED, SIM_PARALLEL at a time, each in the world it draws (nodes,
# zones, workers, the deleted node's max wait, zone guard, periodic sync);
# SIM_CONFIG=default runs the one small world of before. SIM_SEED=N replays one
# seed, its world included, with its whole trace.
SIM_SEEDS ?= 1000
SIM_PARALLEL ?= 2
SIM_OUTPUT := '^(=== RUN|--- |PASS|FAIL|ok)|simulation:|^ +(fault|event|violations|config|move) |^ +[0-9]+ seeds, first|^ +seeds:|sim_test.go'
test-sim:
	SIM_SEEDS=$(SIM_SEEDS) SIM_PARALLEL=$(SIM_PARALLEL) $(GO_TEST) $(TEST_FLAGS) -timeout 30m -v -run 'TestSimulation|TestChecker|TestSweep' ./test/sim/ | \
	  grep -E $(SIM_OUTPUT) ; exit $${PIPESTATUS[0]}

# The long sweep: 200,000 seeds (or SIM_SEEDS) of the simulation, two at a
# time, every seed run whatever it finds; the summary tallies the violations by
# invariant, by shape (with the first seed of each) and by configuration.
sim-sweep:
	SIM_SEEDS=$(if $(filter command line environment,$(origin SIM_SEEDS)),$(SIM_SEEDS),200000) SIM_PARALLEL=2 SIM_KEEP_GOING=1 \
	  $(GO_TEST) $(TEST_FLAGS) -timeout 0 -v -run 'TestSimulation$$' ./test/sim/ | \
	  grep -E $(SIM_OUTPUT) ; exit $${PIPESTATUS[0]}

# The controller (make build) and kubeletsim, built once for every test package
# that runs them (test/framework: ADC_CONTROLLER_BINARY, ADC_KUBELETSIM_BINARY).
TEST_BINARIES := ADC_CONTROLLER_BINARY=$(abspath $(BIN_DIR))/attach-detach-controller ADC_KUBELETSIM_BINARY=$(abspath $(BIN_DIR))/kubeletsim

test-binaries: build
	go build -o $(BIN_DIR)/kubeletsim ./test/kubeletsim

INTEGRATION_PACKAGES = $(shell go list ./test/... | grep -v -e /test/e2e -e /test/sim -e /test/chaos -e /test/hollow -e /test/cluster)

# The tests of a node managed again wait out its 30 s report grace: they run
# in a process (and a cluster) of their own, beside the rest.
INTEGRATION_WAITS = ^TestManagedAgain

test-integration: tools test-binaries
	$(MAKE) --no-print-directory --output-sync=target -j 2 test-integration-rest test-integration-waits

test-integration-rest:
	$(TEST_BINARIES) $(GO_TEST) $(TEST_FLAGS) -timeout 20m -skip '$(INTEGRATION_WAITS)' $(INTEGRATION_PACKAGES)

test-integration-waits:
	$(TEST_BINARIES) $(GO_TEST) $(TEST_FLAGS) -timeout 10m -run '$(INTEGRATION_WAITS)' ./test/integration

# The guard (pkg/guard) beside kube-controller-manager as a cluster that cut
# over runs it (--controllers=*,-attachdetach), through GUARD_SOAK of
# attaches and detaches: no metric, no Warning event, no log line
# (test/integration/deploy TestGuardQuietBesideKubeControllerManager, which
# make test runs for 20 s).
GUARD_SOAK ?= 5m
test-guard-soak: go-tools test-binaries
	ADC_GUARD_SOAK=$(GUARD_SOAK) $(TEST_BINARIES) $(GO_TEST) $(TEST_FLAGS) -timeout 30m -v -run '^TestGuardQuietBesideKubeControllerManager$$' ./test/integration/deploy/ | \
	  grep -E '^(=== RUN|--- |PASS|FAIL|ok)|_test.go' ; exit $${PIPESTATUS[0]}

# The controller binary with the real CSI external-attacher, a CSI mock driver
# and simulated kubelets; in shadow mode, beside kube-controller-manager.
test-e2e: test-binaries
	hack/build-tools.sh $(E2E_TOOLS) kube-controller-manager
	$(TEST_BINARIES) $(GO_TEST) $(TEST_FLAGS) -timeout 10m ./test/e2e/...

# The controller against real kubelets (test/hollow: hollow nodes, the
# kubelet of Kubernetes v1.37.2 with a fake container runtime), each scenario
# with this controller and with kube-controller-manager's attachdetach
# controller: the small set (-short) in make test, every scenario in
# test-hollow-full. Each step's time is logged ("timing" lines).
HOLLOW_OUTPUT := '^(=== RUN|--- |PASS|FAIL|ok)|timing |_test.go'
test-hollow: test-binaries
	hack/build-tools.sh $(E2E_TOOLS) kube-controller-manager
	$(TEST_BINARIES) $(GO_TEST) $(TEST_FLAGS) -short -timeout 15m -v ./test/hollow/ | \
	  grep -E $(HOLLOW_OUTPUT) ; exit $${PIPESTATUS[0]}

test-hollow-full: test-binaries
	hack/build-tools.sh $(E2E_TOOLS) kube-controller-manager
	$(TEST_BINARIES) $(GO_TEST) $(TEST_FLAGS) -timeout 40m -v ./test/hollow/ | \
	  grep -E $(HOLLOW_OUTPUT) ; exit $${PIPESTATUS[0]}

# The controller in a cluster as users run it (test/cluster): kube-scheduler,
# kube-controller-manager with every controller but its attachdetach, the CSI
# external-provisioner and external-attacher of a zonal driver with a
# WaitForFirstConsumer StorageClass, hollow nodes in zones. StatefulSets
# created, scaled, restarted and drained, a Deployment with generic ephemeral
# volumes drained, the cut-over of docs/operations.md and back; a node stopped
# (evicted pods, forced detaches, the out-of-service taint) and a zone cut off
# (nothing force-detached while it is disrupted); no volume ever on two nodes.
# The small set (-short: this controller) in make test; every scenario with
# this controller and with kube-controller-manager's attachdetach in
# test-cluster-full. Each step's time is logged ("timing" lines).
test-cluster: test-binaries
	hack/build-tools.sh $(CLUSTER_TOOLS)
	$(TEST_BINARIES) $(GO_TEST) $(TEST_FLAGS) -short -timeout 10m -v ./test/cluster/ | \
	  grep -E $(HOLLOW_OUTPUT) ; exit $${PIPESTATUS[0]}

test-cluster-full: test-binaries
	hack/build-tools.sh $(CLUSTER_TOOLS)
	$(TEST_BINARIES) $(GO_TEST) $(TEST_FLAGS) -timeout 60m -v ./test/cluster/ | \
	  grep -E $(HOLLOW_OUTPUT) ; exit $${PIPESTATUS[0]}

# The integration and end-to-end tests against each supported kube-apiserver
# release (hack/skew/vMAJOR.MINOR, built from the module proxy into
# _output/skew by hack/skew/build.sh; hack/skew/update.sh moves one to
# another patch release); everything else stays at the controller's release.
# Not part of make test: each server is a build of minutes and each release
# a full run of both suites. Table in _output/skew/results.txt.
SKEW_VERSIONS ?= v1.34 v1.35 v1.36 v1.37
test-skew: tools test-binaries
	hack/build-tools.sh $(E2E_TOOLS) kube-controller-manager
	$(TEST_BINARIES) INTEGRATION_PACKAGES='$(INTEGRATION_PACKAGES)' GO_TEST='$(GO_TEST)' TEST_FLAGS='$(TEST_FLAGS)' \
	  hack/skew/test.sh $(SKEW_VERSIONS)

# Churn and faults on the real stack (test/chaos): a short run in make test,
# CHAOS_DURATION of it with make chaos; CHAOS_SEED=N replays a schedule.
CHAOS_DURATION ?= 10m
test-chaos: tools test-binaries
	hack/build-tools.sh $(E2E_TOOLS)
	CHAOS_DURATION=60s $(TEST_BINARIES) $(GO_TEST) $(TEST_FLAGS) -timeout 10m -v ./test/chaos/... | \
	  grep -E '^(=== RUN|--- |PASS|FAIL|ok)|chaos_test.go|^ +(churn|fault) ' ; exit $${PIPESTATUS[0]}

chaos: tools test-binaries
	hack/build-tools.sh $(E2E_TOOLS)
	CHAOS_DURATION=$(CHAOS_DURATION) $(TEST_BINARIES) $(GO_TEST) $(TEST_FLAGS) -timeout 0 -v -run TestChaos ./test/chaos/... | \
	  grep -E '^(=== RUN|--- |PASS|FAIL|ok)|chaos_test.go|^ +(churn|fault) ' ; exit $${PIPESTATUS[0]}

# Churn and faults on hollow nodes (test/hollow TestChaos), each controller
# in turn: kubelets killed and frozen, the controller SIGKILLed and replaced;
# invariants read from what the real kubelets report. HOLLOW_CHAOS_SEED=N
# replays a schedule.
chaos-hollow: test-binaries
	hack/build-tools.sh $(E2E_TOOLS) kube-controller-manager
	HOLLOW_CHAOS_DURATION=$(CHAOS_DURATION) $(TEST_BINARIES) $(GO_TEST) $(TEST_FLAGS) -timeout 0 -v -run '^TestChaos$$' ./test/hollow/ | \
	  grep -E $(HOLLOW_OUTPUT) ; exit $${PIPESTATUS[0]}

# A whole cluster on hollow nodes (real kubelets): kube-scheduler,
# kube-controller-manager, the CSI provisioner and attacher, this controller;
# kubeletsim is built because the stack checks for it. Ctrl-C stops it and
# removes everything; DEMO_DURATION=60s stops it by itself (exit code 1 if
# the story did not complete).
demo: build
	hack/build-tools.sh $(CLUSTER_TOOLS)
	go build -o $(BIN_DIR)/kubeletsim ./test/kubeletsim
	go build -o $(BIN_DIR)/demo ./hack/demo
	$(BIN_DIR)/demo

# The module checks come first: on a cold cache they wait on the module proxy
# (go list -m all reads every go.mod of the graph), while the CPU is busy
# elsewhere (.ci/run).
verify:
	@out="$$(gofmt -l $$(git ls-files '*.go'))"; if [[ -n "$$out" ]]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	hack/verify-shared-modules.sh
	@# Kubernetes libraries stay on one release.
	@bad="$$(go list -m -f '{{.Path}} {{.Version}}' all | awk '$$1 ~ /^k8s\.io\/(api|apimachinery|apiserver|client-go|component-base|csi-translation-lib|kms)$$/ && $$2 !~ /^v0\.37\./')"; \
	  if [[ -n "$$bad" ]]; then echo "Kubernetes libraries must stay on v0.37.x:"; echo "$$bad"; exit 1; fi
	go vet ./...
	go run $(STATICCHECK) ./...
	hack/verify-dockerfile.sh
	hack/verify-manifests.sh
	hack/verify-chart.sh

# Side by side with kube-controller-manager's attachdetach controller on one
# real kube-apiserver (SIZE=small: 50 nodes x 10 pods, a few minutes;
# SIZE=large: 1,000 x 10; SIZE=huge: 10,000 x 10), plus the Go benchmarks of
# the caches and the per-key decision at 100,000 volumes; report in
# bench/results/<date>-<size>[-qps<QPS>].md, with its plots beside it
# (-burst.svg: the burst over time; -cost.svg: the cost per event by size).
SIZE ?= small
# The API budget of both controllers (kube-controller-manager's defaults).
BENCH_QPS ?= 20
BENCH_BURST ?= 30

bench: build
	hack/build-tools.sh etcd kube-apiserver kube-controller-manager
	mkdir -p _output/bench
	go test -run '^$$' -bench . -benchmem ./pkg/cache ./pkg/reconciler ./pkg/controller | tee _output/bench/go-bench.txt
	go run ./test/bench/cmd/adcbench -size $(SIZE) -qps $(BENCH_QPS) -burst $(BENCH_BURST) -go-bench _output/bench/go-bench.txt

# Pod startup with attachable volumes on hollow nodes (real kubelets), this
# controller then kube-controller-manager's attachdetach on the same nodes:
# ClusterLoader2's pod-startup p50/p90/p99, the time to volumesAttached, and
# what a hollow node costs; report in bench/results/<date>-hollow[-qps<QPS>-burst<BURST>].md
# (BENCH_QPS/BENCH_BURST: both controllers' API budget).
HOLLOW_NODES ?= 50
HOLLOW_PODS_PER_NODE ?= 10
bench-hollow: test-binaries
	hack/build-tools.sh $(E2E_TOOLS) kube-controller-manager
	$(TEST_BINARIES) go run ./test/bench/cmd/hollowbench -nodes $(HOLLOW_NODES) -pods-per-node $(HOLLOW_PODS_PER_NODE) -qps $(BENCH_QPS) -burst $(BENCH_BURST)

# StatefulSets with dynamically provisioned volumes in a whole cluster
# (test/e2e/stack StartCluster: scheduler, kube-controller-manager,
# provisioner, zones), this controller and kube-controller-manager's
# attachdetach (CLUSTER_CONTROLLERS: both, ours or kcm), each in a fresh
# cluster of the same size, CLUSTER_ROUNDS each, alternated: a scale-up 0 -> CLUSTER_REPLICAS (pod startup
# p50/p90/p99 and each component's part), a scale-down, the drain of a node
# with CLUSTER_DRAIN_PODS pods; report in bench/results/<date>-cluster.md
# with its -scaleup.svg plot, logs in _output/bench/cluster.
CLUSTER_NODES ?= 10
CLUSTER_ZONES ?= 2
CLUSTER_REPLICAS ?= 50
CLUSTER_DRAIN_PODS ?= 6
CLUSTER_ROUNDS ?= 2
CLUSTER_CONTROLLERS ?= both
.PHONY: bench-cluster
bench-cluster: test-binaries
	hack/build-tools.sh $(CLUSTER_TOOLS)
	$(TEST_BINARIES) go run ./test/bench/cmd/clusterbench -nodes $(CLUSTER_NODES) -zones $(CLUSTER_ZONES) -replicas $(CLUSTER_REPLICAS) \
	  -drain-pods $(CLUSTER_DRAIN_PODS) -controllers $(CLUSTER_CONTROLLERS) -rounds $(CLUSTER_ROUNDS) -qps $(BENCH_QPS) -burst $(BENCH_BURST)

IMAGE ?= ghcr.io/kube-attach/attach-detach-controller:$(VERSION)

# Needs a Docker engine; make verify checks the Dockerfile without one.
image:
	docker build --build-arg VERSION=$(VERSION) -t $(IMAGE) .

clean:
	rm -rf _output
