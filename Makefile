# Every entry point pins the Go toolchain named by go.mod; the machine's own
# go fetches it from the module proxy on first use.
export GOTOOLCHAIN := go1.27.3
GO ?= go

.PHONY: run test bench fuzz vet fmt deps build soak

## run: start kvroute serve on loopback (no admin token needed there) with the
## embedded Redis and three simulated replicas; README's curls use localhost
run:
	$(GO) run ./cmd/kvroute serve --listen 127.0.0.1:8080 --demo-replicas 3

## test: every test, integration tests against a real redis-server included
test:
	bash scripts/test.sh

## bench: the benchmarks quoted in BENCHMARKS.md (real redis-server)
bench:
	bash scripts/bench.sh

## fuzz: the event decoder's and the HTTP handlers' fuzz targets, bounded
fuzz:
	$(GO) test -run '^$$' -fuzz FuzzDecode -fuzztime 30s ./ingestor/kvevents
	$(GO) test -run '^$$' -fuzz FuzzHandlers -fuzztime 30s ./api

## soak: the bounded chaos soak (issue 23) over real processes; set
## KVROUTE_SOAK_SEED (default 1), KVROUTE_SOAK_DURATION (default 60s),
## KVROUTE_SOAK_REDIS (single, the default, or cluster: a Redis Cluster
## with a replica per primary) and KVROUTE_SOAK_FAULTS (a comma list)
soak:
	KVROUTE_SOAK=1 $(GO) test -run '^TestSoak$$' -count 1 -timeout 40m -v ./tests

build:
	$(GO) build -o bin/kvroute ./cmd/kvroute

vet:
	$(GO) vet ./...

fmt:
	gofmt -l -w .

deps:
	bash scripts/ensure-deps.sh
