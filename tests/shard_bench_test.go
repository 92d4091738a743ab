package tests_test

import (
	"cmp"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/store"
	"github.com/redis/go-redis/v9"
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
// KVROUTE_LOAD_SECS (default 4) the measured time. KVROUTE_SHARD_BREAKDOWN
// set adds a phase with Redis's slow log recording every command, and
// logs each command's (and key's) time per decision: where the shard's
// time goes, with the script's own Redis calls apart from its Lua.
//
// Each shape runs twice: reads=primary with everything on one server, and
// reads=replica with the lookups' reads on a replica of it (the store's
// ReadURL, as --redis-read-replicas does on a Cluster). The shard is then
// the pair, and its ceiling the rate over the busier one's busy fraction.
func BenchmarkShardCeiling(b *testing.B) {
	for _, shape := range []struct{ reps, blocks int }{{64, 2048}, {8, 64}} {
		for _, reads := range []string{"primary", "replica"} {
			b.Run(fmt.Sprintf("replicas=%d/blocks=%d/reads=%s", shape.reps, shape.blocks, reads), func(b *testing.B) {
				for b.Loop() {
					shardCeiling(b, shape.reps, shape.blocks, reads == "replica")
				}
			})
		}
	}
}

func shardCeiling(b *testing.B, nRep, nBlocks int, onReplica bool) {
	ctx := context.Background()
	workers := envInt("KVROUTE_SHARD_WORKERS", 32)
	secs := time.Duration(envInt("KVROUTE_LOAD_SECS", 4)) * time.Second
	url, rc, st, prompts := loadFixture(b, nRep, nBlocks)
	var replica *redis.Client
	if onReplica {
		addr := redistest.Replica(b, strings.TrimPrefix(url, "redis://"))
		replica = redis.NewClient(&redis.Options{Addr: addr})
		b.Cleanup(func() { replica.Close() })
		var err error
		if st, err = store.OpenConfig(ctx, store.Config{URL: url, ReadURL: "redis://" + addr}, store.Options{}); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
	}
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
	var q0, q1 redisStats
	if replica != nil {
		q0 = readRedisStats(b, replica)
	}
	n, degraded, elapsed := run(secs)
	r1 := readRedisStats(b, rc)
	if replica != nil {
		q1 = readRedisStats(b, replica)
	}
	if n == 0 {
		b.Fatal("no decision made")
	}
	busy := (r1.cpu - r0.cpu).Seconds() / elapsed.Seconds()
	rate := float64(n) / elapsed.Seconds()
	ceiling := rate / min(busy, 1)
	redisPer := (r1.cpu - r0.cpu) / time.Duration(n)
	if replica != nil {
		rbusy := (q1.cpu - q0.cpu).Seconds() / elapsed.Seconds()
		ceiling = rate / min(max(busy, rbusy), 1)
		served, failed := st.ReplicaReads()
		b.Logf("replica: main thread %.0f%% busy, %.1f µs CPU per decision, %.2f HMGETs per decision; lookups it served %d, failed over %d",
			100*rbusy, us((q1.cpu-q0.cpu)/time.Duration(n)), float64(q1.calls["hmget"]-q0.calls["hmget"])/float64(n), served, failed)
		b.ReportMetric(us((q1.cpu-q0.cpu)/time.Duration(n)), "replica-µs/dec")
		b.ReportMetric(100*rbusy, "replica-busy-%")
	}
	evals := float64(r1.calls["evalsha"]-r0.calls["evalsha"]) / float64(n)
	getRPS, getCPU, _ := redisBenchmarkGet(b, url)
	script := float64(r1.usec["evalsha"]-r0.usec["evalsha"]) / float64(n)
	plain := float64(r1.usec["hmget"]-r0.usec["hmget"]) / float64(n)
	writes := float64(r1.writes-r0.writes) / float64(n)
	b.Logf("%d workers: %.0f decisions/s (%d degraded), Redis main thread %.0f%% busy; per decision %.1f µs CPU, %.2f scripts taking %.1f µs, HMGET %.1f µs (in scripts too), %.2f replies written",
		workers, rate, degraded, 100*busy, us(redisPer), evals, script, plain, writes)
	b.Logf("shard ceiling %.0f decisions/s; redis-benchmark GET -c 50: %.0f req/s (%.2f µs Redis CPU per GET)", ceiling, getRPS, us(getCPU))
	if os.Getenv("KVROUTE_SHARD_BREAKDOWN") != "" {
		shardBreakdown(b, rc, func() int64 { n, _, _ := run(secs / 2); return n })
	}
	b.ReportMetric(rate, "dec/s")
	b.ReportMetric(100*busy, "redis-busy-%")
	b.ReportMetric(us(redisPer), "redis-µs/dec")
	b.ReportMetric(writes, "redis-writes/dec")
	b.ReportMetric(ceiling, "shard-ceiling-dec/s")
	b.ReportMetric(getRPS, "get-rps")
	b.ReportMetric(ceiling/getRPS, "a:shard-ceiling/get")
}

// shardBreakdown runs decisions (run returns how many it made) with the
// slow log recording every command, and logs per command and key the
// calls and the server's µs per decision. The slow log times a command's
// execution only: a script's time includes its own calls (upper-case,
// as Redis logs them), and neither includes reading the request or
// writing the reply.
func shardBreakdown(b *testing.B, rc *redis.Client, run func() int64) {
	ctx := context.Background()
	for _, kv := range [][2]string{{"slowlog-log-slower-than", "0"}, {"slowlog-max-len", "1000000"}} {
		if err := rc.ConfigSet(ctx, kv[0], kv[1]).Err(); err != nil {
			b.Fatal(err)
		}
	}
	defer func() {
		// Redis's defaults: the server is this benchmark's own.
		rc.ConfigSet(ctx, "slowlog-log-slower-than", "10000")
		rc.ConfigSet(ctx, "slowlog-max-len", "128")
	}()
	if err := rc.Do(ctx, "slowlog", "reset").Err(); err != nil {
		b.Fatal(err)
	}
	n := run()
	logs, err := rc.SlowLogGet(ctx, -1).Result()
	if err != nil {
		b.Fatal(err)
	}
	if len(logs) >= 1000000 {
		b.Fatalf("the slow log filled up (%d entries): shorten KVROUTE_LOAD_SECS for the breakdown", len(logs))
	}
	type agg struct {
		calls int
		took  time.Duration
	}
	by := map[string]*agg{}
	for _, l := range logs {
		if len(l.Args) < 2 || strings.EqualFold(l.Args[0], "slowlog") {
			continue
		}
		k := l.Args[0] + " " + l.Args[1]
		if strings.EqualFold(l.Args[0], "evalsha") {
			k = l.Args[0] + " " + l.Args[1][:8]
		}
		a := by[k]
		if a == nil {
			a = &agg{}
			by[k] = a
		}
		a.calls++
		a.took += l.Duration
	}
	keys := slices.SortedFunc(maps.Keys(by), func(x, y string) int { return cmp.Compare(by[y].took, by[x].took) })
	// One line: a benchmark's log keeps only its first ten.
	var parts []string
	for _, k := range keys {
		a := by[k]
		parts = append(parts, fmt.Sprintf("%s %.2f calls %.1f µs", k, float64(a.calls)/float64(n), us(a.took)/float64(n)))
	}
	b.Logf("slow log, per decision (%d decisions): %s", n, strings.Join(parts, "; "))
}
