package tests_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/router"
)

// BenchmarkShardCeiling measures one Redis's decision ceiling directly:
// BenchmarkLoad's corpus, and as many decisions as one redis-server
// answers when it is the bottleneck. The decisions are router.Route's
// (lookup, scoring, booking with its retries) from goroutines in this
// process: no HTTP and no JSON, so that this machine's two CPUs are
// enough to keep Redis's one thread busy, which the pods (a millisecond
// of CPU per 32k-token decision each) cannot. Where Redis is not quite
// saturated the ceiling is the measured rate over Redis's busy fraction.
// redis-benchmark GET runs against the same server in the same run.
//
//	go test -run '^$' -bench ShardCeiling -benchtime 1x -timeout 10m ./tests/
//
// KVROUTE_SHARD_WORKERS (default 32) sets the decisions in flight,
// KVROUTE_LOAD_SECS (default 4) the measured time.
func BenchmarkShardCeiling(b *testing.B) {
	for _, shape := range []struct{ reps, blocks int }{{64, 2048}, {8, 64}} {
		b.Run(fmt.Sprintf("replicas=%d/blocks=%d", shape.reps, shape.blocks), func(b *testing.B) {
			for b.Loop() {
				shardCeiling(b, shape.reps, shape.blocks)
			}
		})
	}
}

func shardCeiling(b *testing.B, nRep, nBlocks int) {
	ctx := context.Background()
	workers := envInt("KVROUTE_SHARD_WORKERS", 32)
	secs := time.Duration(envInt("KVROUTE_LOAD_SECS", 4)) * time.Second
	url, rc, st, prompts := loadFixture(b, nRep, nBlocks)
	rt, err := router.New(st, st, router.DefaultConfig(), router.Options{Rand: rand.New(rand.NewPCG(3, 3))})
	if err != nil {
		b.Fatal(err)
	}
	run := func(d time.Duration) (n, degraded int64, elapsed time.Duration) {
		var next, done, deg atomic.Int64
		var wg sync.WaitGroup
		stop := time.Now().Add(d)
		start := time.Now()
		for range workers {
			wg.Go(func() {
				for time.Now().Before(stop) {
					i := next.Add(1)
					dec, err := rt.Route(ctx, router.Request{Model: "bench", Tokens: prompts[i%int64(len(prompts))], MaxTokens: 64})
					if err != nil {
						b.Errorf("route: %v", err)
						return
					}
					if dec.Degraded {
						deg.Add(1)
					}
					done.Add(1)
				}
			})
		}
		wg.Wait()
		return done.Load(), deg.Load(), time.Since(start)
	}
	run(secs / 4) // warm-up: connections, hints, script cache
	r0 := readRedisStats(b, rc)
	n, degraded, elapsed := run(secs)
	r1 := readRedisStats(b, rc)
	if n == 0 {
		b.Fatal("no decision made")
	}
	busy := (r1.cpu - r0.cpu).Seconds() / elapsed.Seconds()
	rate := float64(n) / elapsed.Seconds()
	ceiling := rate / min(busy, 1)
	redisPer := (r1.cpu - r0.cpu) / time.Duration(n)
	evals := float64(r1.calls["evalsha"]-r0.calls["evalsha"]) / float64(n)
	getRPS, getCPU, _ := redisBenchmarkGet(b, url)
	script := float64(r1.usec["evalsha"]-r0.usec["evalsha"]) / float64(n)
	plain := float64(r1.usec["hmget"]-r0.usec["hmget"]) / float64(n)
	b.Logf("%d workers: %.0f decisions/s (%d degraded), Redis main thread %.0f%% busy; per decision %.1f µs CPU, %.2f scripts taking %.1f µs, HMGET %.1f µs (in scripts too)",
		workers, rate, degraded, 100*busy, us(redisPer), evals, script, plain)
	b.Logf("shard ceiling %.0f decisions/s; redis-benchmark GET -c 50: %.0f req/s (%.2f µs Redis CPU per GET)", ceiling, getRPS, us(getCPU))
	b.ReportMetric(rate, "dec/s")
	b.ReportMetric(100*busy, "redis-busy-%")
	b.ReportMetric(us(redisPer), "redis-µs/dec")
	b.ReportMetric(ceiling, "shard-ceiling-dec/s")
	b.ReportMetric(getRPS, "get-rps")
	b.ReportMetric(ceiling/getRPS, "a:shard-ceiling/get")
}
