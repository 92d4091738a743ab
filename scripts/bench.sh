#!/usr/bin/env bash
# The benchmarks quoted in BENCHMARKS.md, in one run so that ratios compare
# figures measured side by side. Every Redis figure is against a real
# redis-server started by the benchmark on loopback.
set -euo pipefail
cd "$(dirname "$0")/.."
export GOTOOLCHAIN="${GOTOOLCHAIN:-go1.27.3}"
bash scripts/ensure-deps.sh

echo "== block keying (root package)"
go test -run '^$' -bench 'BlockKeys' -benchtime 2000x .
echo "== decision latency vs PING and the in-memory reference (tests/)"
go test -run '^$' -bench 'Decision' -benchtime 300x ./tests/
echo "== store: lookup, apply, memory per entry"
go test -run '^$' -bench 'Lookup|Ping|Apply|Memory' -benchtime 1s ./store/
echo "== event ingestion vs redis-benchmark HSET (tests/)"
go test -run '^$' -bench 'Ingest' -benchtime 5x ./tests/
echo "== simulator speed on the full Mooncake trace (sim/)"
go test -run '^$' -bench 'Trace' -benchtime 3x ./sim/
echo "== tokenizer: cold throughput against Hugging Face's Rust tokenizer on the same text (tokenizer/)"
node tokenizer/testdata/gen/bench_hf.js qwen3 llama3_1 gemma3
node tokenizer/testdata/gen/bench_hf.js --prose qwen3 llama3_1 gemma3
go test -run '^$' -bench 'BenchmarkEncode$|BenchmarkEncodeProse' -benchtime 2s ./tokenizer/
echo "== tokenizer: turn 20 of a 20-turn chat (8k-token system prompt), with and without the cache"
go test -run '^$' -bench 'EncodeTurn20' -benchtime 200x ./tokenizer/
echo "== front door: a ~32k-token messages decision against the same token_ids decision; proxy time to first byte (tests/)"
go test -run '^$' -bench 'FrontDoor|ProxyTTFB' -benchtime 500x ./tests/
echo "== token forwarding: time to first byte of a ~39k-token text completion, ids forwarded vs text (tests/)"
go test -run '^$' -bench 'TokenForwarding' -benchtime 40x ./tests/
echo "== /v1/route body decoding: the single-pass token ids against encoding/json over the whole body (api/)"
go test -run '^$' -bench 'DecodeRouteRequest' -benchtime 2s ./api/
echo "== throughput ceiling: kvroute serve processes over one redis-server, open-loop load at 25/50/90% of the ceiling, vs redis-benchmark GET (tests/)"
go test -run '^$' -bench 'BenchmarkLoad' -benchtime 1x -timeout 20m ./tests/
echo "== one shard's decision ceiling, measured with Redis the bottleneck, vs redis-benchmark GET (tests/)"
go test -run '^$' -bench 'BenchmarkShardCeiling' -benchtime 1x -timeout 10m ./tests/
echo "== tracing overhead: decision p50 with OpenTelemetry on (always_on, OTLP to an in-test receiver) against off (tests/)"
go test -count=3 -run '^$' -bench 'BenchmarkTracingOverhead' -benchtime 6000x ./tests/
echo "== scale-to-zero cold start: a fresh serve process to its first matching decision (infra/)"
go test -run '^$' -bench 'BenchmarkColdStart' -benchtime 20x ./infra/
echo "== discovery: DNS change to the first (and last) decision naming a replica, over dnsmasq, kvroute ingest and serve (tests/)"
go test -count=1 -v -run 'TestDNSDiscovery' ./tests/ | grep -E 'registered|decision naming|registry matches'
