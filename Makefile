# assay — make help lists the targets.

GO      ?= go
MODULES := pkg pkg/devkit pkg/devkit/devpg pkg/devkit/testenv schemas services/ingress services/classifier services/committer services/ledger cmd/assay cmd/chaos cmd/images deploy/k8s
# -race needs cgo; the race detector roughly doubles test time on 2 cores.
TESTFLAGS ?= -race -count=1 -timeout 15m
# Modules whose tests build and unpack images or render manifests run
# without -race: they have no concurrency of their own to check, and the
# race detector triples the time spent compressing layers.
NORACE  := cmd/images deploy/k8s
FUZZTIME  ?= 30s
# The ugly-path and concurrency tests run again, repeated, under -race.
UGLYCOUNT ?= 3
UGLYRUN   ?= TestUgly|TestLateAnswerFromLostLease|TestConcurrentIdenticalSubmissions|TestWebhookReplayedConcurrently
# make chaos CHAOSFLAGS='-seed 7 -n 1000'; see cd cmd/chaos && go run . -h
CHAOSFLAGS ?=
# make chaos-cluster CLUSTERFLAGS='-seed 7 -n 100000 -load 40m'; the same harness with -cluster
CLUSTERFLAGS ?=
# make images IMAGEFLAGS='-arch arm64 -tar ../../bin/images.tar'; see cd cmd/images && go run . -h
IMAGEFLAGS ?=
# make bench BENCHFLAGS='-n 20000 -c 8,32 --runs 3 --peer ../../../shared/peers/riverpipe'
BENCHFLAGS ?= -n 20000 -c 8,32
# make build stamps the binaries with these; --version, the start-up log and
# assay_build_info show them (Go's own VCS stamp wins where it has one).
VERSION  ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
LDFLAGS  := -X assay.dev/pkg/buildinfo.version=$(VERSION) -X assay.dev/pkg/buildinfo.revision=$(REVISION)
SERVICES := ingress classifier committer ledger

.PHONY: help demo serve test chaos chaos-cluster build images vet fmt fuzz tidy bench bench-goodput k8s-apiserver-check docs bin/assay bin/assay-dev $(addprefix bin/,$(SERVICES))

help: ## list the targets
	@grep -E '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-20s %s\n", $$1, $$2}'

# $(TICK) NAME & runs in the background while a long build runs in the
# foreground, saying every 30 seconds that NAME is still being built; the
# recipe kills it ($$!) when the build ends.
TICK := tick() { i=0; while sleep 1; do i=$$((i+1)); [ $$((i % 30)) -ne 0 ] || echo "  $$1: still building, $${i}s"; done; }; tick

# demo and serve run bin/assay-dev, the development binary, built as make
# build builds it (go build only relinks what changed), so they share make
# build's compiled packages rather than compiling the workspace's versions a
# second time. serve builds bin/assay as well: the commands it prints for
# the cells it runs are the operator tool's.
demo: bin/assay-dev ## run both cells on embedded defaults, submit the evaluation set, print results (bin/assay-dev dev)
	bin/assay-dev dev

serve: bin/assay-dev bin/assay ## run both cells with the HTTP API up until Ctrl-C (bin/assay-dev dev --serve)
	bin/assay-dev dev --serve

test: ## run every module's tests against real Postgres and real JetStream
	@set -e; for m in $(MODULES); do \
		f="$(TESTFLAGS)"; case " $(NORACE) " in *" $$m "*) f=$$(echo "$$f" | sed 's/-race//');; esac; \
		echo "== $$m"; (cd $$m && $(GO) test $$f ./...); \
	done
	@set -e; for m in $(MODULES); do \
		if grep -rqsE --include='*_test.go' 'func ($(UGLYRUN))[A-Za-z0-9_]*\(' $$m; then \
			echo "== $$m (ugly-path and concurrency tests again, -count=$(UGLYCOUNT))"; \
			(cd $$m && $(GO) test -race -count=$(UGLYCOUNT) -timeout 15m -run '^($(UGLYRUN))' ./...); \
		fi; \
	done

chaos: ## kill, restart and starve the services under load; check the exactly-once invariants (CHAOSFLAGS)
	cd cmd/chaos && $(GO) run . $(CHAOSFLAGS)

chaos-cluster: ## the same on 3-node JetStream clusters, Postgres primary + synchronous standby, 2 of every service; partitions, leader kills, failover (CLUSTERFLAGS)
	cd cmd/chaos && $(GO) run . -cluster $(CLUSTERFLAGS)

build: ## the binaries, each module on its own (GOWORK=off), into bin/, a line per binary: assay, assay-dev and the four services
	@echo "make build: bin/assay-dev first (it links the four services and compiles what they share: minutes when cold), then bin/assay and the four services side by side"
	@$(MAKE) --no-print-directory bin/assay-dev
	@$(MAKE) --no-print-directory -j 4 bin/assay $(addprefix bin/,$(SERVICES))

# One go build per binary, timed. go build decides what is current.
# bin/assay-dev is cmd/assay/assay-dev: dev, dev webhook and bench, which
# run the cells in the process; bin/assay, the operator's tool, links none
# of the services.
bin/assay-dev:
	@mkdir -p bin; start=$$(date +%s); \
	echo "  bin/assay-dev: go build (the first build compiles every package the services share: about 4 minutes; later ones seconds)"; \
	$(TICK) bin/assay-dev & tick=$$!; \
	(cd cmd/assay && GOWORK=off $(GO) build -ldflags "$(LDFLAGS)" -o ../../bin/assay-dev ./assay-dev); rc=$$?; kill $$tick; \
	[ $$rc -eq 0 ] || exit $$rc; \
	printf '  %-16s %ss\n' bin/assay-dev $$(( $$(date +%s) - start ))

bin/assay:
	@mkdir -p bin; start=$$(date +%s); \
	(cd cmd/assay && GOWORK=off $(GO) build -ldflags "$(LDFLAGS)" -o ../../bin/assay .) || exit 1; \
	printf '  %-16s %ss\n' bin/assay $$(( $$(date +%s) - start ))

$(addprefix bin/,$(SERVICES)): bin/%:
	@mkdir -p bin; start=$$(date +%s); \
	(cd services/$* && GOWORK=off $(GO) build -ldflags "$(LDFLAGS)" -o ../../bin/$* ./cmd/$*) || exit 1; \
	printf '  %-16s %ss\n' bin/$* $$(( $$(date +%s) - start ))

images: ## container images of the five binaries, static on an empty base, as an OCI layout in bin/images (IMAGEFLAGS)
	cd cmd/images && $(GO) run . -go $(GO) -out ../../bin/images $(IMAGEFLAGS)

# The check's two builds print a line each, and a line every 30s while they
# run: the test binary (client-go, kustomize) and kube-apiserver itself,
# into the user's cache as the test would build it (KUBE_APISERVER, when
# set, names one built elsewhere and skips that build).
K8SCHECK := $(CURDIR)/bin/k8s-apiserver-check.test
KUBEAPI  := $(or $(KUBE_APISERVER),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/assay-k8s-apiserver/kube-apiserver)

k8s-apiserver-check: ## every kustomization under deploy/k8s (each optional component on each overlay, the trial included) on a real kube-apiserver (built from k8s.io/kubernetes) and Debian's etcd, server-side dry runs (not part of make test: the build takes long)
	@mkdir -p bin; start=$$(date +%s); \
	echo "k8s-apiserver-check: building the check's test binary (client-go, kustomize: minutes the first time)"; \
	$(TICK) bin/k8s-apiserver-check.test & tick=$$!; \
	(cd deploy/k8s/apiserver && GOWORK=off $(GO) test -c -o $(K8SCHECK) .); rc=$$?; kill $$tick; \
	[ $$rc -eq 0 ] || exit $$rc; \
	printf '  %-32s %ss\n' bin/k8s-apiserver-check.test $$(( $$(date +%s) - start ))
	@if [ -n "$(KUBE_APISERVER)" ]; then echo "k8s-apiserver-check: kube-apiserver from KUBE_APISERVER=$(KUBE_APISERVER)"; exit 0; fi; \
	start=$$(date +%s); mkdir -p "$(dir $(KUBEAPI))"; \
	echo "k8s-apiserver-check: building kube-apiserver from k8s.io/kubernetes into $(KUBEAPI) (minutes the first time; later ones seconds)"; \
	$(TICK) kube-apiserver & tick=$$!; \
	(cd deploy/k8s/apiserver && GOWORK=off $(GO) build -o "$(KUBEAPI)" k8s.io/kubernetes/cmd/kube-apiserver); rc=$$?; kill $$tick; \
	[ $$rc -eq 0 ] || exit $$rc; \
	printf '  %-32s %ss\n' kube-apiserver $$(( $$(date +%s) - start ))
	@echo "k8s-apiserver-check: etcd, kube-apiserver and the server-side dry runs"
	cd deploy/k8s/apiserver && KUBE_APISERVER="$(KUBEAPI)" $(K8SCHECK) -test.v -test.count=1 -test.timeout 90m

vet: ## go vet and gofmt every module, and build each on its own (GOWORK=off)
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) vet ./... && GOWORK=off $(GO) build ./...); done
	@test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }

bench: ## pipeline benchmark: N items through ingress to accepted and ledgered, beside the River build (BENCHFLAGS)
	cd cmd/assay && $(GO) run ./assay-dev bench pipeline $(BENCHFLAGS)

bench-goodput: ## admission benchmark: 5 scenarios, adaptive vs baseline, over real JetStream and Postgres
	cd cmd/assay && $(GO) run ./assay-dev bench goodput

fuzz: ## run each fuzz target for FUZZTIME
	cd pkg && $(GO) test -run='^$$' -fuzz=FuzzParse -fuzztime=$(FUZZTIME) ./diff
	cd pkg && $(GO) test -run='^$$' -fuzz=FuzzCheck -fuzztime=$(FUZZTIME) ./gate
	cd pkg && $(GO) test -run='^$$' -fuzz=FuzzCompleteResponse -fuzztime=$(FUZZTIME) ./model
	cd pkg && $(GO) test -run='^$$' -fuzz=FuzzDecode -fuzztime=$(FUZZTIME) ./event
	cd services/ingress && $(GO) test -run='^$$' -fuzz=FuzzDecodeSubmit -fuzztime=$(FUZZTIME) .
	cd services/ingress && $(GO) test -run='^$$' -fuzz=FuzzWebhook -fuzztime=$(FUZZTIME) .
	cd services/classifier && $(GO) test -run='^$$' -fuzz=FuzzAnswerBytes -fuzztime=$(FUZZTIME) .

docs: ## write the pages of docs/ made from the code: configuration.md from the settings the binaries read, api.md's operations from schemas/openapi.yaml
	cd cmd/assay && $(GO) run ./internal/docgen -root ../..

tidy: ## go mod tidy every module
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) mod tidy); done
