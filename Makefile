# assay — make help lists the targets.

GO      ?= go
MODULES := pkg schemas services/ingress services/classifier services/committer services/ledger cmd/assay
# -race needs cgo; the race detector roughly doubles test time on 2 cores.
TESTFLAGS ?= -race -count=1 -timeout 15m
FUZZTIME  ?= 30s

.PHONY: help demo serve test build vet fmt fuzz tidy

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'

demo: ## run both cells on embedded defaults, submit the evaluation set, print results
	cd cmd/assay && $(GO) run . dev

serve: ## run both cells with the HTTP API up until Ctrl-C
	cd cmd/assay && $(GO) run . dev --serve

test: ## run every module's tests against real Postgres and real JetStream
	@set -e; for m in $(MODULES); do \
		echo "== $$m"; (cd $$m && $(GO) test $(TESTFLAGS) ./...); \
	done

build: ## build every module on its own (GOWORK=off) into bin/
	@set -e; mkdir -p bin; for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) build ./...); done
	cd cmd/assay && GOWORK=off $(GO) build -o ../../bin/assay .
	@for s in ingress classifier committer ledger; do \
		(cd services/$$s && GOWORK=off $(GO) build -o ../../bin/$$s ./cmd/$$s) || exit 1; done

vet: ## go vet and gofmt every module
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) vet ./...); done
	@test -z "$$(gofmt -l .)" || { gofmt -l .; exit 1; }

fuzz: ## run each fuzz target for FUZZTIME
	cd pkg && $(GO) test -run='^$$' -fuzz=FuzzParse -fuzztime=$(FUZZTIME) ./diff
	cd pkg && $(GO) test -run='^$$' -fuzz=FuzzCheck -fuzztime=$(FUZZTIME) ./gate
	cd pkg && $(GO) test -run='^$$' -fuzz=FuzzCompleteResponse -fuzztime=$(FUZZTIME) ./model
	cd pkg && $(GO) test -run='^$$' -fuzz=FuzzDecode -fuzztime=$(FUZZTIME) ./event
	cd services/ingress && $(GO) test -run='^$$' -fuzz=FuzzDecodeSubmit -fuzztime=$(FUZZTIME) .
	cd services/ingress && $(GO) test -run='^$$' -fuzz=FuzzWebhook -fuzztime=$(FUZZTIME) .

tidy: ## go mod tidy every module
	@set -e; for m in $(MODULES); do (cd $$m && $(GO) mod tidy); done
