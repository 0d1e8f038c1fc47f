# gputopo — see README.md. Test tiers (STYLE §12):
#   test-unit         no API server
#   test-integration  real etcd + kube-apiserver (+ kube-scheduler, kubelet)
#                     from bin/, built by `make tools`
SHELL := /usr/bin/env bash
.SHELLFLAGS := -euo pipefail -c

GO          ?= go
BIN         := $(CURDIR)/bin
VERSION     ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo v0.0.0-dev)
LDFLAGS     := -X github.com/gputopo/gputopo/cmd/gputopo/app.Version=$(VERSION)
# Integration packages start real kubelets on the fixed device-plugin path;
# they run one package at a time.
INTEGRATION_FLAGS ?= -tags integration -p 1 -count=1 -timeout 40m
export KUBEBUILDER_ASSETS := $(BIN)

GENERATED := api/v1alpha1/zz_generated.deepcopy.go charts/gputopo/crds charts/gputopo/values.schema.json

.PHONY: all build image demo-plugin gputopo-scheduler kubectl-gputopo tools kubectl prometheus generate verify test test-unit test-integration test-security bench bench-scheduler bench-scheduler-quick bench-peers demo clean help

all: build

help: ## List targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

build: gputopo-scheduler ## Build bin/gputopo and bin/gputopo-scheduler
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/gputopo ./cmd/gputopo

kubectl-gputopo: ## Build the kubectl plugin into bin/kubectl-gputopo (kubectl runs it as `kubectl gputopo` when bin/ is on PATH)
	CGO_ENABLED=0 $(GO) build -ldflags "$(LDFLAGS)" -o $(BIN)/kubectl-gputopo ./cmd/kubectl-gputopo

tools: ## Build the control-plane binaries and the workload controllers into bin/ (about 17 minutes cold, cached)
	bash hack/tools/build.sh
	bash hack/tools/controllers.sh

# gputopo-scheduler is kube-scheduler with gputopo's plugin compiled in. It is
# its own module (cmd/gputopo-scheduler) so that the main module does not
# depend on k8s.io/kubernetes; it builds with the tools' flags and is stamped
# with the Kubernetes version it contains (--version) and gputopo's.
# About 8 minutes cold on 2 cores, seconds when only gputopo changed.
gputopo-scheduler: ## Build bin/gputopo-scheduler (kube-scheduler + the GPUTopology plugin)
	cd cmd/gputopo-scheduler && kver=$$($(GO) list -m -f '{{.Version}}' k8s.io/kubernetes) && \
	  CGO_ENABLED=0 $(GO) build -trimpath -o $(BIN)/gputopo-scheduler \
	    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$$kver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$$(echo $$kver | cut -d. -f2) -X k8s.io/component-base/version.gitTreeState=clean -X github.com/gputopo/gputopo/schedplugin.Version=$(VERSION)" .

# kubectl is built from the tools' pins in a scratch module (_out/kubectl-build)
# whose go.sum may grow by kubectl's own modules: the tools' stamp stays as it
# is. After `make tools` most of it is in the build cache (about a minute).
kubectl: $(BIN)/kubectl ## Build kubectl into bin/ (the plugin-discovery test runs `kubectl gputopo` with it)

$(BIN)/kubectl: hack/tools/go.mod hack/tools/go.sum
	@mkdir -p _out/kubectl-build
	cp hack/tools/go.mod hack/tools/go.sum _out/kubectl-build/
	cd _out/kubectl-build && sed -i 's#^module .*#module kubectl-build#' go.mod && \
	  kver=$$($(GO) list -m -f '{{.Version}}' k8s.io/kubernetes) && \
	  CGO_ENABLED=0 GOFLAGS=-mod=mod $(GO) build -trimpath -o $(BIN)/kubectl \
	    -ldflags "-s -w -X k8s.io/component-base/version.gitVersion=$$kver -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$$(echo $$kver | cut -d. -f2)" \
	    k8s.io/kubernetes/cmd/kubectl

prometheus: ## Install Debian's prometheus package if missing (the Prometheus telemetry test skips without it)
	bash hack/tools/prometheus.sh

generate: tools ## Regenerate deepcopy and CRD YAML with controller-gen, and the chart's values.schema.json from values.yaml
	$(BIN)/controller-gen object paths=./api/...
	$(BIN)/controller-gen crd paths=./api/... output:crd:dir=charts/gputopo/crds
	$(GO) run ./hack/chartschema

verify: generate ## gofmt, go vet, and generated files up to date
	@unformatted=$$(gofmt -l $$(git ls-files '*.go') $$(git ls-files --others --exclude-standard '*.go')); \
	if [ -n "$$unformatted" ]; then echo "verify: gofmt would change:"; echo "$$unformatted"; exit 1; fi
	@if ! git diff --quiet -- $(GENERATED) || [ -n "$$(git ls-files --others --exclude-standard -- $(GENERATED))" ]; then \
	  echo "verify: generated files are stale; run 'make generate' and commit:"; \
	  git status --short -- $(GENERATED); exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags integration ./...
	cd cmd/gputopo-scheduler && $(GO) vet ./...
	cd hack/image && $(GO) vet ./...
	@echo "verify: ok"

test: verify test-unit test-integration ## Every test tier

# The decision core (ledger, evaluator, both front ends) is shared by
# concurrent verbs and scheduling goroutines: its unit tests also run under
# the race detector.
RACE_PKGS := ./placement/... ./extender/... ./schedplugin/... ./topology/...

test-unit: ## Unit tests (no API server); the decision core's again with -race
	$(GO) test -count=1 ./...
	$(GO) test -race -count=1 $(RACE_PKGS)

test-integration: tools kubectl gputopo-scheduler image ## Integration and e2e tests on the real control plane
	$(GO) test $(INTEGRATION_FLAGS) ./...

# The security suite: attempts as a tenant, a client on the pod network and a
# compromised node (test/security), plus the tests of the other suites that
# hold the same line: the chart's mutual TLS with the real kube-scheduler, its
# RBAC and resource name, its values schema, the envvar warning and the
# toolkit check's mount, device-list strategies under a real kubelet, a
# renamed GPU resource end to end, the container processes' environment and
# CDI devices on containerd, and the installed extender refusing a client on
# the pod network.
SECURITY_TESTS_CHART    := TestRenderedSchedulerConfigRunsThroughExtender|TestRenderedPluginModeSchedulesInProcess|TestChartLintsAndRendersWhatTheComponentsRead|TestEveryComponentGetsTheGPUResourceName|TestSchedulerImageFollowsTheCluster|TestChartSchemaRefusesUnknownAndMistypedValues|TestChartNotesWarnOfTheEnvvarStrategy|TestChartRendersTheToolkitConfigMount|TestChartRendersNodeAgentPriorityAndCriticalPodsQuota|TestChartCriticalAgentAdmittedWhereQuotaLimitsCriticalPods
SECURITY_TESTS_NODE     := TestDeviceListStrategyWithRealKubelet
SECURITY_TESTS_E2E      := TestRenamedGPUResource|TestEndToEndContainerd
SECURITY_TESTS_INSTALL  := TestHelmInstallExtenderMode

test-security: tools gputopo-scheduler image ## The security suite alone (real control plane, kube-scheduler and kubelet)
	$(GO) test $(INTEGRATION_FLAGS) ./test/security/
	$(GO) test $(INTEGRATION_FLAGS) -run '$(SECURITY_TESTS_CHART)' ./test/chart/
	$(GO) test $(INTEGRATION_FLAGS) -run '$(SECURITY_TESTS_NODE)' ./test/nodeagent/
	$(GO) test $(INTEGRATION_FLAGS) -run '$(SECURITY_TESTS_E2E)' ./test/e2e/
	$(GO) test $(INTEGRATION_FLAGS) -run '$(SECURITY_TESTS_INSTALL)' ./test/install/

# The machine files imported from real servers, which the generalisation
# benchmark's families draw from beside the built-in machines.
comma := ,
FAMILY_MACHINES := $(subst $(eval) ,$(comma),$(sort $(wildcard topology/machine/testdata/smi/*.yaml)))

bench: ## Benchmarks (allocator, extender, webhook), the simulator on the bundled traces, the placement, gang, sliced and preemption suites and the generalisation families (about 9 minutes in all for the families, three replicas each); regenerates docs/benchmarks.md
	@mkdir -p _out
	{ echo "cores: $$(nproc)"; grep MemTotal /proc/meminfo; $(GO) version; echo "run: $$(date -u +%FT%TZ)"; } > _out/machine.txt
	$(GO) test -run '^$$' -bench . -benchmem ./topology/allocator/ ./extender/ ./webhook/ | tee _out/bench.txt
	$(GO) run ./cmd/gputopo simulate --trace bundled:mixed --out _out/sim-mixed
	$(GO) run ./cmd/gputopo simulate --trace bundled:fragment --out _out/sim-fragment
	$(GO) run ./cmd/gputopo simulate --suite --out _out/sim-suite
	$(GO) run ./cmd/gputopo simulate --gang-suite --out _out/sim-gang
	$(GO) run ./cmd/gputopo simulate --sliced-suite --out _out/sim-sliced
	$(GO) run ./cmd/gputopo simulate --preemption-suite --out _out/sim-preempt
	$(GO) run ./cmd/gputopo simulate --family tune --family-machines $(FAMILY_MACHINES) --out _out/sim-family-tune
	$(GO) run ./cmd/gputopo simulate --family test --family-machines $(FAMILY_MACHINES) --out _out/sim-family-test
	$(GO) run ./test/schedbench/docsplice -doc docs/benchmarks.md machine=text:_out/machine.txt go-bench=text:_out/bench.txt \
	  sim-mixed=_out/sim-mixed/report.md sim-fragment=_out/sim-fragment/report.md sim-suite=_out/sim-suite/report.md \
	  sim-gang=_out/sim-gang/report.md sim-sliced=_out/sim-sliced/report.md sim-preempt=_out/sim-preempt/report.md \
	  sim-family-tune=_out/sim-family-tune/report.md sim-family-test=_out/sim-family-test/report.md

# SCHEDBENCH_NODES, SCHEDBENCH_PODS and SCHEDBENCH_REPS override the sizes.
SCHEDBENCH_NODES ?= 1000,5000,15000
SCHEDBENCH_PODS  ?= 1000
SCHEDBENCH_REPS  ?= 3
bench-scheduler: tools gputopo-scheduler ## kube-scheduler pods/s: plain, no-op HTTP extender, gputopo extender, gputopo plugin build (GPUsBound Event off and on); 1000, 5000 and 15000 nodes x 3, about 12 minutes; regenerates docs/benchmarks.md
	@mkdir -p _out
	SCHEDBENCH_NODES=$(SCHEDBENCH_NODES) SCHEDBENCH_PODS=$(SCHEDBENCH_PODS) SCHEDBENCH_REPS=$(SCHEDBENCH_REPS) SCHEDBENCH_OUT=_out/schedbench.md \
	  $(GO) test -tags schedbench -run TestSchedulerThroughput -count=1 -v -timeout 90m ./test/schedbench/ > _out/schedbench.log 2>&1 \
	  || { tail -40 _out/schedbench.log; exit 1; }
	cat _out/schedbench.md
	$(GO) run ./test/schedbench/docsplice -doc docs/benchmarks.md schedbench=_out/schedbench.md

# A quick size for iteration: 1,000 nodes, plain and the plugin build, one
# repetition; docs/benchmarks.md is left alone. SCHEDBENCH_PLUGIN_BASELINE=<a
# binary in bin/> adds a plugin build to compare (before and after a change).
bench-scheduler-quick: tools gputopo-scheduler ## kube-scheduler pods/s at 1000 nodes, plain and plugin build, 1 repetition (about 1 minute after the builds); writes _out/schedbench-quick.md only
	@mkdir -p _out
	SCHEDBENCH_NODES=1000 SCHEDBENCH_PODS=1000 SCHEDBENCH_REPS=1 SCHEDBENCH_OUT=_out/schedbench-quick.md \
	  SCHEDBENCH_MODES=plain,plugin$${SCHEDBENCH_PLUGIN_BASELINE:+,baseline} \
	  $(GO) test -tags schedbench -run TestSchedulerThroughput -count=1 -v -timeout 30m ./test/schedbench/ > _out/schedbench-quick.log 2>&1 \
	  || { tail -40 _out/schedbench-quick.log; exit 1; }
	cat _out/schedbench-quick.md

# The peers on one node set and one burst of Jobs (test/ecosystem/peers_test.go):
# plain kube-scheduler, Kueue TAS with kube-scheduler, koord-scheduler (built
# here from its own module, hack/tools/koordinator.sh), KAI-Scheduler (built
# from its source, hack/tools/kai.sh: KAI_SRC=<dir>, else a clone of its
# pinned commit), Volcano (built from its source, hack/tools/volcano.sh:
# VOLCANO_SRC=<dir>, else a clone of its pinned commit) and gputopo in both
# modes. PEERS_MODE=full: 64 nodes instead of 16; PEERS_MODE=nvl72: two
# GB200 NVL72 racks. PEERS=<names> picks some. A peer whose source could not
# be fetched is left out of a run that did not name it, and the report says so.
PEERS_MODE ?= quick
bench-peers: tools gputopo-scheduler ## The peers measured beside gputopo on one real control plane each: kube-scheduler, Kueue TAS, koord-scheduler, KAI-Scheduler, Volcano, gputopo extender and plugin (quick: 16 nodes, about 5 minutes after the builds; PEERS_MODE=full: 64 nodes); regenerates docs/benchmarks.md
	@mkdir -p _out
	hack/tools/koordinator.sh
	KAI_SRC="$(KAI_SRC)" hack/tools/kai.sh || echo "kai: not built; the bench leaves KAI-Scheduler out and says why"
	VOLCANO_SRC="$(VOLCANO_SRC)" hack/tools/volcano.sh || echo "volcano: not built; the bench leaves Volcano out and says why"
	PEERS_MODE=$(PEERS_MODE) $(GO) test -tags integration,peers -run TestPeers -count=1 -p 1 -v -timeout 60m ./test/ecosystem/ > _out/peers.log 2>&1 \
	  || { tail -60 _out/peers.log; exit 1; }
	cat _out/peers.md
	@if [ -n "$$PEERS" ]; then echo "PEERS picks some schedulers: docs/benchmarks.md left as it is"; \
	  else $(GO) run ./test/schedbench/docsplice -doc docs/benchmarks.md peers-$(PEERS_MODE)=_out/peers.md; fi

# The image as an OCI archive, without a container engine: Debian's libc6
# as the base layer, the binaries on top, assembled by hack/image (its own
# module, go-containerregistry). Push: skopeo copy oci-archive:_out/gputopo-image.tar docker://REGISTRY/gputopo:TAG
# The pod sandbox image (_out/pause-image.tar, hack/image/pause) and
# kube-scheduler from bin/ (_out/kube-scheduler-image.tar) are for the
# runtime tests' containerd, which cannot pull registry.k8s.io here.
IMAGE_REF ?= ghcr.io/gputopo/gputopo:$(VERSION)
PAUSE_REF ?= localhost/gputopo/pause:$(VERSION)
image: tools gputopo-scheduler ## Build the image (and the runtime tests' pause image) as OCI archives in _out/ (no container engine needed)
	@mkdir -p _out/image
	CGO_ENABLED=1 $(GO) build -trimpath -tags nodemo -ldflags "-s -w $(LDFLAGS)" -o _out/image/gputopo ./cmd/gputopo
	cp $(BIN)/gputopo-scheduler _out/image/gputopo-scheduler
	bash hack/image/debs.sh _out/image/debs
	cd hack/image && $(GO) run . -out $(CURDIR)/_out/gputopo-image.tar -ref $(IMAGE_REF) -version $(VERSION) \
	  -debs "$$(ls $(CURDIR)/_out/image/debs/*.deb | paste -sd, -)" -bin $(CURDIR)/_out/image/gputopo,$(CURDIR)/_out/image/gputopo-scheduler
	cd hack/image && CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-s -w" -o $(CURDIR)/_out/image/pause ./pause
	cd hack/image && $(GO) run . -single /pause -user 65535:65535 -out $(CURDIR)/_out/pause-image.tar -ref $(PAUSE_REF) -version $(VERSION) -bin $(CURDIR)/_out/image/pause
	cd hack/image && $(GO) run . -single /usr/local/bin/kube-scheduler -out $(CURDIR)/_out/kube-scheduler-image.tar \
	  -ref localhost/gputopo/kube-scheduler:$$($(BIN)/kube-scheduler --version | cut -d' ' -f2) -version $(VERSION) -bin $(BIN)/kube-scheduler

demo: tools kubectl-gputopo ## Run the whole system on a simulated mixed GPU cluster and the same workload under plain kube-scheduler, job by job (about 30 s once the tools are built; DEMO_FLAGS=--keep keeps it up for kubectl gputopo)
	$(GO) run -ldflags "$(LDFLAGS)" ./cmd/gputopo demo $(DEMO_FLAGS)

demo-plugin: tools kubectl-gputopo gputopo-scheduler ## The demo through gputopo-scheduler, the plugin build (gputopo demo --mode plugin)
	$(GO) run -ldflags "$(LDFLAGS)" ./cmd/gputopo demo --mode plugin $(DEMO_FLAGS)

clean: ## Remove build outputs except the cached control-plane binaries
	rm -f $(BIN)/gputopo $(BIN)/kubectl-gputopo
