package tests_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/refindex"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/store"
	"github.com/redis/go-redis/v9"
)

// fleetCorpus loads a realistic fleet into the store and the reference
// index: every replica holds a 4-block system prompt, a quarter of them hold
// the request's own prefix to different depths (the ones that matter, as in
// an agent fleet), and every replica holds unrelated conversations too.
func fleetCorpus(tb testing.TB, ctx context.Context, st *store.Store, nRep, nBlocks int) ([]uint32, *refindex.Index, []kvroute.Replica) {
	tb.Helper()
	const bs = kvroute.DefaultBlockSize
	r := rand.New(rand.NewPCG(uint64(nRep), uint64(nBlocks)))
	toks := func(n int) []uint32 { return randTokens(r, n) }
	ks := kvroute.KeySpace{Model: "bench"}
	sys := toks(4 * bs)
	prompt := append(append([]uint32(nil), sys...), toks((nBlocks-4)*bs)...)
	reqKeys := kvroute.BlockKeys(ks, bs, prompt, nil)
	ref := refindex.New(nRep)
	var reps []kvroute.Replica
	for i := range nRep {
		id := fmt.Sprintf("r%03d", i)
		reps = append(reps, kvroute.Replica{ID: id, Model: "bench", URL: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:1"})
		if err := st.PutReplica(ctx, reps[i]); err != nil {
			tb.Fatal(err)
		}
		held := reqKeys[:4]
		if i%4 == 0 {
			held = reqKeys[:nBlocks/2+r.IntN(nBlocks/2+1)]
		}
		other := kvroute.BlockKeys(ks, bs, append(append([]uint32(nil), sys...), toks(64*bs)...), nil)
		seq := int64(0)
		for _, chain := range [][]kvroute.BlockKey{held, other} {
			seq = holdChain(tb, ctx, st, "bench", id, chain, seq, func(j int) uint64 { return uint64(chain[j]) ^ uint64(i) })
			ref.Store(i, chain)
		}
	}
	return prompt, ref, reps
}

type latencies []time.Duration

func (l latencies) p50() time.Duration {
	s := slices.Clone(l)
	slices.Sort(s)
	return s[len(s)/2]
}

// BenchmarkDecision measures a full routing decision (keys, one Lookup,
// scoring, one Reserve) against a real redis-server, and in the same run
// the two things the target is stated in: one loopback Redis round trip
// (PING) and the in-memory reference index doing the same lookup.
// Target: decision p50 <= 3 × (PING p50 + in-memory p50) at 64 × 2048.
func BenchmarkDecision(b *testing.B) {
	ctx := context.Background()
	url := redistest.Server(b)
	for _, nRep := range []int{4, 64, 256} {
		for _, nBlocks := range []int{64, 2048} {
			b.Run(fmt.Sprintf("replicas=%d/blocks=%d", nRep, nBlocks), func(b *testing.B) {
				st, err := store.Open(ctx, url, store.Options{})
				if err != nil {
					b.Fatal(err)
				}
				defer st.Close()
				opt, _ := redis.ParseURL(url)
				rc := redis.NewClient(opt)
				if err := rc.FlushAll(ctx).Err(); err != nil {
					b.Fatal(err)
				}
				rc.Close()
				prompt, ref, reps := fleetCorpus(b, ctx, st, nRep, nBlocks)
				ids := make([]string, len(reps))
				for i, r := range reps {
					ids[i] = r.ID
				}
				cfg := router.DefaultConfig()
				cfg.RegistryTTL = time.Hour
				rt, err := router.New(st, st, cfg, router.Options{Rand: rand.New(rand.NewPCG(1, 2))})
				if err != nil {
					b.Fatal(err)
				}
				keys := kvroute.BlockKeys(kvroute.KeySpace{Model: "bench"}, kvroute.DefaultBlockSize, prompt, nil)
				matched := make([]int, nRep)
				const probes = 300
				var ping, mem latencies
				for range probes {
					t0 := time.Now()
					if err := st.Ping(ctx); err != nil {
						b.Fatal(err)
					}
					ping = append(ping, time.Since(t0))
					t0 = time.Now()
					ref.Matched(keys, matched)
					mem = append(mem, time.Since(t0))
				}
				// The decision's two store calls, timed alone, to show where
				// its time goes.
				var look, resv latencies
				for i := range probes {
					t0 := time.Now()
					if _, _, err := st.Lookup(ctx, "bench", keys, ids); err != nil {
						b.Fatal(err)
					}
					look = append(look, time.Since(t0))
					l := kvroute.Lease{RequestID: store.RequestID("bench", fmt.Sprintf("probe-%d", i)), Model: "bench", Replica: ids[0], PrefillBlocks: 1, DecodeBlocks: 1, Expires: time.Now().Add(time.Minute)}
					t0 = time.Now()
					if _, _, err := st.Reserve(ctx, l, -1); err != nil {
						b.Fatal(err)
					}
					resv = append(resv, time.Since(t0))
					if _, err := st.Release(ctx, l.RequestID); err != nil {
						b.Fatal(err)
					}
				}
				t0 := time.Now()
				for range probes {
					kvroute.BlockKeys(kvroute.KeySpace{Model: "bench"}, kvroute.DefaultBlockSize, prompt, nil)
				}
				keying := time.Since(t0) / probes
				var dec latencies
				b.ResetTimer()
				for b.Loop() {
					t0 := time.Now()
					d, err := rt.Route(ctx, router.Request{Model: "bench", Tokens: prompt})
					if err != nil {
						b.Fatal(err)
					}
					dec = append(dec, time.Since(t0))
					b.StopTimer()
					if _, err := rt.Release(ctx, d.RequestID); err != nil {
						b.Fatal(err)
					}
					b.StartTimer()
				}
				budget := ping.p50() + mem.p50()
				b.ReportMetric(float64(dec.p50().Microseconds()), "decision-p50-µs")
				b.ReportMetric(float64(ping.p50().Microseconds()), "ping-p50-µs")
				b.ReportMetric(float64(mem.p50().Microseconds()), "inmem-p50-µs")
				b.ReportMetric(float64(look.p50().Microseconds()), "lookup-p50-µs")
				b.ReportMetric(float64(resv.p50().Microseconds()), "reserve-p50-µs")
				b.ReportMetric(float64(keying.Microseconds()), "keying-µs")
				b.ReportMetric(float64(dec.p50())/float64(budget), "x-(ping+inmem)")
			})
		}
	}
}

// randTokens is n token ids drawn from r, in a 50k vocabulary: the
// benchmark corpora's prompts.
func randTokens(r *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(r.IntN(50_000))
	}
	return t
}
