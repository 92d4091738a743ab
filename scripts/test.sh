#!/usr/bin/env bash
# The test command (`make test`, and so .ci/run). It installs what the tests
# need, vets, runs every package's tests with a real redis-server, runs the
# event decoder's fuzz target for a bounded time, and prints a summary whose
# last line counts what passed and failed.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"
bash scripts/ensure-deps.sh

echo "== go vet"
go vet ./...

echo "== go test (real redis-server for every Redis path)"
log=$(mktemp)
status=0
go test -count=1 -timeout 15m -v ./... >"$log" 2>&1 || status=$?
# Package results, skips, failures, and proof that Redis tests ran for real.
grep -E '^(ok|FAIL|---[[:space:]]FAIL|---[[:space:]]SKIP|panic:)|real redis-server' "$log" | sed -e 's/^[[:space:]]*//' -e 's/ at 127\.0\.0\.1:[0-9]*$//' | awk '!seen[$0]++' || true
echo "Redis-backed tests run against a real server: $(grep -c 'real redis-server' "$log" || true) redis-server processes started"
echo "Redis Cluster tests run against a real cluster: $(grep -c 'real Redis Cluster' "$log" || true) clusters started"
if [ "$status" -ne 0 ]; then
  echo "== failures (full log: $log)"
  awk -f scripts/failures.awk "$log" | head -300
  grep -E '^(panic:|FAIL[[:space:]])' "$log" | head -20 || true
fi
passed=$(grep -cE '^[[:space:]]*--- PASS' "$log" || true)
failed=$(grep -cE '^[[:space:]]*--- FAIL' "$log" || true)
skipped=$(grep -cE '^[[:space:]]*--- SKIP' "$log" || true)

echo "== go test -race (the packages with concurrency)"
rstatus=0
rlog=$(mktemp)
go test -race -count=1 -timeout 10m -v ./router ./api ./ingestor ./discovery/... ./internal/app ./tests ./vllmtest ./prompt ./tokenizer >"$rlog" 2>&1 || rstatus=$?
grep -E '^(ok|FAIL|---[[:space:]]FAIL|WARNING: DATA RACE|panic:)' "$rlog" || true
if [ "$rstatus" -ne 0 ]; then
  failed=$((failed + 1))
  echo "== race-run failures (full log: $rlog)"
  awk -f scripts/failures.awk "$rlog" | head -200
  grep -B2 -A40 -E '^WARNING: DATA RACE|^panic:' "$rlog" | head -200 || tail -100 "$rlog"
fi
fstatus=0
if [ -d ingestor/kvevents ] && grep -q 'func FuzzDecode' ingestor/kvevents/*_test.go 2>/dev/null; then
  echo "== fuzz FuzzDecode (bounded)"
  go test -run '^$' -fuzz FuzzDecode -fuzztime "${FUZZTIME:-20s}" ./ingestor/kvevents 2>&1 | tail -3 || fstatus=$?
  if [ "$fstatus" -ne 0 ]; then failed=$((failed + 1)); fi
fi

hstatus=0
if grep -q 'func FuzzHandlers' api/*_test.go 2>/dev/null; then
  echo "== fuzz FuzzHandlers (bounded)"
  go test -run '^$' -fuzz FuzzHandlers -fuzztime "${FUZZTIME_HTTP:-10s}" ./api 2>&1 | tail -3 || hstatus=$?
  if [ "$hstatus" -ne 0 ]; then failed=$((failed + 1)); fi
fi

dstatus=0
if grep -q 'func FuzzDecodeRouteRequest' api/*_test.go 2>/dev/null; then
  echo "== fuzz FuzzDecodeRouteRequest (bounded)"
  go test -run '^$' -fuzz FuzzDecodeRouteRequest -fuzztime "${FUZZTIME_DECODE:-10s}" ./api 2>&1 | tail -3 || dstatus=$?
  if [ "$dstatus" -ne 0 ]; then failed=$((failed + 1)); fi
fi

# The chaos soak's short form (make soak runs it for longer, and on a
# Redis Cluster with KVROUTE_SOAK_REDIS=cluster): real processes, a seeded
# fault schedule, and the invariants checked at the end.
echo "== chaos soak (short: KVROUTE_SOAK_DURATION=${SOAK_DURATION:-20s})"
sstatus=0
slog=$(mktemp)
KVROUTE_SOAK=1 KVROUTE_SOAK_DURATION="${SOAK_DURATION:-20s}" go test -run '^TestSoak$' -count=1 -timeout 5m -v ./tests >"$slog" 2>&1 || sstatus=$?
grep -E '^(ok|FAIL|---[[:space:]](PASS|FAIL)|panic:)|soak_test.go:[0-9]+: (seed|admission|blocks|index|phantom)' "$slog" | sed -e 's/^[[:space:]]*//' || true
if [ "$sstatus" -ne 0 ]; then
  failed=$((failed + 1))
  echo "== soak failures (full log: $slog)"
  awk -f scripts/failures.awk "$slog" | head -100
fi

echo "tests: $passed passed, $failed failed, $skipped skipped"
[ "$status" -eq 0 ] && [ "$rstatus" -eq 0 ] && [ "$fstatus" -eq 0 ] && [ "$hstatus" -eq 0 ] && [ "$dstatus" -eq 0 ] && [ "$sstatus" -eq 0 ]
