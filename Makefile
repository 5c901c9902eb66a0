# The two entry points a new machine needs are `make demo` and `make test`.
# Everything else is a building block of those two.

SQLC_VERSION := v1.31.1
GOBIN        ?= $(shell go env GOPATH)/bin
SQLC         := $(GOBIN)/sqlc
GO_TEST_FLAGS ?= -race -count=1 -timeout 25m
# The Mailpit that make demo runs and the web UI test loads (scripts/demo.env).
MAILPIT_VERSION := $(shell sed -n 's/^MAILPIT_VERSION=//p' scripts/demo.env)
# The axe-core release the console's browser test checks each page with
# (e2e/console_test.go's axeVersion).
AXE_VERSION := 4.10.3

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: demo
demo: ## Run the whole demo locally: dev broker, orders API + relay, notifier, Mailpit.
	./scripts/demo.sh

.PHONY: test
test: lint sqlc-check test-tools ## Lint, check generated code, run every test with the race detector, fuzz each decoder briefly, run every benchmark once on tiny inputs.
	go test $(GO_TEST_FLAGS) ./...
	$(MAKE) fuzz FUZZTIME=20000x
	$(MAKE) bench-smoke

.PHONY: test-short
test-short: test-tools ## Run the tests without the race detector (quicker feedback).
	go test -count=1 ./...

# Before the tests rather than inside them, so that the Mailpit build (npm
# and Go, about a minute the first time, then cached in .demo/bin) does not
# compete with the test packages for the CPU and the test's own call finds
# it done. Chromium is Debian's package (root needed when it is missing).
.PHONY: test-tools
test-tools: ## Install Chromium, build the demo's Mailpit with its web UI, and install axe-core, for the browser tests.
	./scripts/install-chromium.sh
	./scripts/build-mailpit.sh $(MAILPIT_VERSION) >/dev/null
	./scripts/install-axe.sh $(AXE_VERSION) >/dev/null

.PHONY: lint
lint: ## gofmt and go vet (and golangci-lint when installed; see .golangci.yaml).
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	go vet ./...
	@if command -v golangci-lint >/dev/null 2>&1; then golangci-lint run ./...; \
	  else echo "golangci-lint not installed; skipped (gofmt and go vet ran)"; fi

$(SQLC):
	./scripts/install-sqlc.sh $(SQLC_VERSION)

# Every sqlc configuration: the services' own, the reusable packages'
# (each owns its queries, migrations and generated code), and the example
# service's.
SQLC_CONFIGS := sqlc.yaml internal/outbox/sqlc.yaml internal/outbox/operate/sqlc.yaml internal/inbox/sqlc.yaml examples/invoices/sqlc.yaml

.PHONY: sqlc
sqlc: $(SQLC) ## Regenerate the sqlc code after changing queries or migrations.
	./scripts/install-sqlc.sh $(SQLC_VERSION)
	@for f in $(SQLC_CONFIGS); do echo "sqlc generate -f $$f"; $(SQLC) generate -f $$f || exit 1; done

.PHONY: sqlc-check
sqlc-check: ## Fail when the committed sqlc code differs from what the pinned sqlc generates.
	./scripts/install-sqlc.sh $(SQLC_VERSION)
	@for f in $(SQLC_CONFIGS); do echo "sqlc diff -f $$f"; $(SQLC) diff -f $$f || exit 1; done

.PHONY: build
build: ## Build all binaries into ./bin.
	go build -o bin/ ./cmd/...

.PHONY: bench
bench: ## Run the Go benchmarks, then the end-to-end benchmark tool (cmd/bench, 30-45 minutes).
	go test -run '^$$' -bench Commands -benchtime 2000x ./internal/orders
	go test -run '^$$' -bench . -benchtime 5x ./internal/outbox/... ./internal/notify
	go run ./cmd/bench all

.PHONY: bench-smoke
bench-smoke: ## Run every benchmark for one iteration and the benchmark tool at tiny sizes, so they keep working (make test ends with it).
	go test -short -run '^$$' -bench . -benchtime 1x ./internal/...
	go run ./cmd/bench -tiny all

# Every decoder of outside input, with the package that holds its fuzz
# target: HTTP bodies, the admin APIs' input rule (path, query, body),
# Kafka records (the wire format, the inbox's decode-or-park contract, the
# notifier's order events).
FUZZ_TARGETS := \
	./internal/ordersapi:FuzzCreateOrder \
	./internal/outbox/adminguard:FuzzAdminInput \
	./internal/outbox/cloudevents:FuzzDecode \
	./internal/inbox:FuzzRecord \
	./internal/notify:FuzzDecodeRecord
FUZZTIME ?= 60s

.PHONY: fuzz
# make test counts inputs (20000x) rather than seconds: Go 1.26's fuzzing
# coordinator can report a bare "context deadline exceeded" at the end of a
# -fuzztime duration on a busy machine, with no failing input (go.dev/issue/75804).
fuzz: ## Fuzz every decoder for FUZZTIME each (default 60s; make test runs 20000 inputs each).
	@for t in $(FUZZ_TARGETS); do pkg=$${t%%:*}; fn=$${t##*:}; \
	  echo "go test $$pkg -run '^$$' -fuzz '^$$fn\$$' -fuzztime $(FUZZTIME)"; \
	  go test $$pkg -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) || exit 1; done
