# pgcoord's build. `make test` runs the tests; `make help` lists the rest.
SHELL := bash
.SHELLFLAGS := -o pipefail -ec
.DEFAULT_GOAL := help

SQLC_VERSION := v1.31.1
SQLC ?= $(shell command -v sqlc || echo $(shell go env GOPATH)/bin/sqlc)
GO_TEST_FLAGS ?= -race -count=1 -timeout 20m

.PHONY: help
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-16s %s\n", $$1, $$2}'

.PHONY: demo
demo: ## replay the three incidents of the mission, naive vs pgcoord ($$PGCOORD_DATABASE_URL, or Docker)
	@if [ -z "$${PGCOORD_DATABASE_URL:-}" ]; then \
	  export PGCOORD_TEST_IMAGE=$${PGCOORD_DEMO_IMAGE:-$${PGCOORD_TEST_IMAGE:-postgres:17}}; \
	  source scripts/test-env.sh; export PGCOORD_DEMO_IMAGE=$$PGCOORD_TEST_IMAGE; \
	fi; \
	go run ./cmd/pgcoord-demo

.PHONY: test
test: ## run every test against real PostgreSQL (see README: Testing)
	source scripts/test-env.sh && go test $(GO_TEST_FLAGS) -json ./... | go run ./internal/tools/testreport

.PHONY: soak
soak: ## run the fault-injection suite and the partition chaos test for SOAK (default 10m); PGCOORD_FAULT_SEED=N replays a seed
	source scripts/test-env.sh && PGCOORD_FAULT_DURATION=$${SOAK:-10m} \
	  go test -race -count=1 -timeout 0 -run '^(TestFaults|TestPartitionChaos)$$' -v ./integration_test

.PHONY: ha-test
ha-test: ## fail a three-node Patroni cluster over under every workload (HA_MODE=sync|strict|async; docs/ha.md)
	trap 'scripts/ha-cluster.sh down' EXIT; \
	cluster=$$(scripts/ha-cluster.sh up $${HA_MODE:-sync}) && eval "$$cluster" && \
	PGCOORD_HA_URL=$$PGCOORD_HA_URL PGCOORD_HA_PROXY_URL=$$PGCOORD_HA_PROXY_URL PGCOORD_HA_MODE=$${HA_MODE:-sync} \
	  go test -race -count=1 -timeout $$(( $${PGCOORD_HA_ROUNDS:-1} * 20 + 10 ))m -run '^TestHAFailovers$$' -v ./integration_test

.PHONY: ha-soak
ha-soak: ## ha-test for ROUNDS rounds of every fault (default 5)
	$(MAKE) ha-test PGCOORD_HA_ROUNDS=$${ROUNDS:-5}

.PHONY: build
build: ## build bin/pgcoord
	go build -o bin/pgcoord ./cmd/pgcoord

.PHONY: vet
vet: ## go vet and gofmt
	go vet ./...
	@test -z "$$(gofmt -l .)" || { echo "gofmt would change:"; gofmt -l .; exit 1; }

.PHONY: generate
generate: $(SQLC) ## regenerate internal/dbsqlc from sql/ with sqlc
	$(SQLC) generate

.PHONY: check-generated
check-generated: $(SQLC) ## fail if internal/dbsqlc is not what sqlc generates from sql/
	$(SQLC) diff || { echo "internal/dbsqlc is stale: run 'make generate' and commit the result"; exit 1; }

$(SQLC):
	@echo "installing sqlc $(SQLC_VERSION) (builds from source with cgo; about 5 minutes, once)"
	go install github.com/sqlc-dev/sqlc/cmd/sqlc@$(SQLC_VERSION)

.PHONY: tools
tools: $(SQLC) ## install the pinned code generators

.PHONY: bench
bench: ## run `pgcoord bench` against $$PGCOORD_DATABASE_URL
	go run ./cmd/pgcoord bench

.PHONY: bench-redis
bench-redis: ## measure a Redis GCRA limiter beside pgcoord's (needs redis-server; ARGS='--duration 2s')
	scripts/bench-redis.sh $(ARGS)
