# The two entry points a new machine needs are `make demo` and `make test`.
# Everything else is a building block of those two.

SQLC_VERSION := v1.31.1
GOBIN        ?= $(shell go env GOPATH)/bin
SQLC         := $(GOBIN)/sqlc
GO_TEST_FLAGS ?= -race -count=1 -timeout 25m

.DEFAULT_GOAL := help

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-12s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: demo
demo: ## Run the whole demo locally: dev broker, orders API + relay, notifier, Mailpit.
	./scripts/demo.sh

.PHONY: test
test: lint sqlc-check ## Lint, check generated code, then run every test with the race detector.
	go test $(GO_TEST_FLAGS) ./...

.PHONY: test-short
test-short: ## Run the tests without the race detector (quicker feedback).
	go test -count=1 ./...

.PHONY: lint
lint: ## gofmt and go vet (and golangci-lint when installed; see .golangci.yaml).
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	  if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	go vet ./...
	@if command -v golangci-lint >/dev/null 2>&1; then golangci-lint run ./...; \
	  else echo "golangci-lint not installed; skipped (gofmt and go vet ran)"; fi

$(SQLC):
	./scripts/install-sqlc.sh $(SQLC_VERSION)

# Every sqlc configuration: the services' own, and the reusable packages'
# (each owns its queries, migrations and generated code).
SQLC_CONFIGS := sqlc.yaml internal/outbox/sqlc.yaml internal/inbox/sqlc.yaml

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
bench: ## Run the benchmarks (write path, relay drain, consumer throughput), five iterations each.
	go test -run '^$$' -bench Commands -benchtime 2000x ./internal/orders
	go test -run '^$$' -bench . -benchtime 5x ./internal/outbox ./internal/notify

.PHONY: bench-smoke
bench-smoke: ## Run every benchmark for one iteration, so they keep working (CI does this).
	go test -run '^$$' -bench . -benchtime 1x ./internal/...

.PHONY: fuzz
fuzz: ## Fuzz request decoding for a minute.
	go test ./internal/ordersapi -run '^$$' -fuzz FuzzCreateOrder -fuzztime 60s
