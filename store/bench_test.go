package store_test

import (
	"context"
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/store"
	"github.com/redis/go-redis/v9"
)

// fleet is a realistic index for one request: every replica holds a shared
// system prompt, a few hold long prefixes of the request (each a different
// length), and every replica also holds an unrelated conversation branching
// off the system prompt.
type fleet struct {
	req   []kvroute.BlockKey
	reps  []string
	holds map[string][]kvroute.BlockKey // replica -> chains stored
}

func newFleet(nrep, nblocks int) *fleet {
	rng := rand.New(rand.NewPCG(uint64(nrep), uint64(nblocks)))
	f := &fleet{req: chain(rng, nblocks), reps: replicaNames(nrep), holds: map[string][]kvroute.BlockKey{}}
	sys := min(32, nblocks/2)
	long := min(8, nrep) // replicas holding long prefixes of the request
	for i, r := range f.reps {
		if i < long {
			f.holds[r] = f.req[:nblocks-i*nblocks/(2*long)]
			continue
		}
		other := append(slices.Clone(f.req[:sys]), chain(rng, nblocks/4+1)...)
		f.holds[r] = other
	}
	return f
}

func (f *fleet) load(tb testing.TB, s *store.Store) int {
	tb.Helper()
	return f.loadAs(tb, s, mdl)
}

// loadAs stores the fleet's chains under model name.
func (f *fleet) loadAs(tb testing.TB, s *store.Store, name string) int {
	tb.Helper()
	ctx := context.Background()
	n := 0
	for _, r := range f.reps {
		c := f.holds[r]
		seq := int64(0)
		for from := 0; from < len(c); from += 512 {
			seq++
			if _, err := s.Apply(ctx, name, r, seq, storeChain(c, from, min(from+512, len(c)), kvroute.TierGPU)); err != nil {
				tb.Fatal(err)
			}
		}
		n += len(c)
	}
	return n
}

func benchStore(b *testing.B) (*store.Store, *redis.Client) {
	b.Helper()
	return benchStoreOpt(b, store.Options{})
}

func benchStoreOpt(b *testing.B, opt store.Options) (*store.Store, *redis.Client) {
	b.Helper()
	url := redistest.Server(b)
	s, err := store.Open(context.Background(), url, opt)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { s.Close() })
	o, _ := redis.ParseURL(url)
	rc := redis.NewClient(o)
	b.Cleanup(func() { rc.Close() })
	return s, rc
}

// serverUsecPerCall reads Redis's own time per call of cmd since the last
// CONFIG RESETSTAT: the script's cost inside Redis, without the round trip.
func serverUsecPerCall(b *testing.B, rc *redis.Client, cmd string) float64 {
	b.Helper()
	info, err := rc.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(line, "cmdstat_"+cmd+":"); ok {
			for _, kv := range strings.Split(rest, ",") {
				if v, ok := strings.CutPrefix(kv, "usec_per_call="); ok {
					f, _ := strconv.ParseFloat(strings.TrimSpace(v), 64)
					return f
				}
			}
		}
	}
	return 0
}

// serverCPU is the Redis main thread's CPU time so far.
func serverCPU(b *testing.B, rc *redis.Client) time.Duration {
	b.Helper()
	info, err := rc.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var d time.Duration
	for _, line := range strings.Split(info, "\n") {
		k, v, _ := strings.Cut(strings.TrimSpace(line), ":")
		if k == "used_cpu_sys_main_thread" || k == "used_cpu_user_main_thread" {
			f, _ := strconv.ParseFloat(v, 64)
			d += time.Duration(f * float64(time.Second))
		}
	}
	return d
}

func reportPercentiles(b *testing.B, d []time.Duration) {
	slices.Sort(d)
	if len(d) == 0 {
		return
	}
	b.ReportMetric(float64(d[len(d)/2].Microseconds()), "p50-µs")
	b.ReportMetric(float64(d[len(d)*99/100].Microseconds()), "p99-µs")
}

// BenchmarkLookup measures one Lookup (overlaps of every candidate plus their
// loads, one round trip) against a real redis-server. redis-µs/op is the
// script's time inside Redis (from INFO commandstats).
//
// hints=off is every lookup cold (Options.NoLookupHints); hints=on repeats
// the request, so its run ends are known from the previous lookup and the
// search proves them in one HMGET: the figure for a chain coming back.
func BenchmarkLookup(b *testing.B) {
	for _, nrep := range []int{4, 64, 256} {
		for _, nblk := range []int{12, 64, 2048} {
			for _, hints := range []bool{true, false} {
				b.Run(fmt.Sprintf("replicas=%d/blocks=%d/hints=%s", nrep, nblk, map[bool]string{true: "on", false: "off"}[hints]), func(b *testing.B) {
					s, rc := benchStoreOpt(b, store.Options{NoLookupHints: !hints})
					f := newFleet(nrep, nblk)
					f.load(b, s)
					ctx := context.Background()
					ov, _, err := s.Lookup(ctx, mdl, f.req, f.reps)
					if err != nil {
						b.Fatal(err)
					}
					if ov[0].GPU != nblk {
						b.Fatalf("replica 0 matches %d blocks, want %d", ov[0].GPU, nblk)
					}
					rc.ConfigResetStat(ctx)
					lat := make([]time.Duration, 0, b.N)
					cpu0 := serverCPU(b, rc)
					b.ResetTimer()
					for b.Loop() {
						t0 := time.Now()
						if _, _, err := s.Lookup(ctx, mdl, f.req, f.reps); err != nil {
							b.Fatal(err)
						}
						lat = append(lat, time.Since(t0))
					}
					b.StopTimer()
					b.ReportMetric(serverUsecPerCall(b, rc, "evalsha"), "redis-µs/op")
					// Plain reads run no script: the main thread's CPU counts
					// both kinds of lookup.
					b.ReportMetric(float64((serverCPU(b, rc)-cpu0).Microseconds())/float64(len(lat)), "redis-cpu-µs/op")
					reportPercentiles(b, lat)
				})
			}
		}
	}
}

// BenchmarkDecision is the store's part of a routing decision: Lookup, then
// Reserve on the pick with the version it scored on (and, untimed, Release).
func BenchmarkDecision(b *testing.B) {
	s, _ := benchStore(b)
	f := newFleet(64, 2048)
	f.load(b, s)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	i := 0
	for b.Loop() {
		i++
		t0 := time.Now()
		_, loads, err := s.Lookup(ctx, mdl, f.req, f.reps)
		if err != nil {
			b.Fatal(err)
		}
		id := store.RequestID(mdl, "d"+strconv.Itoa(i))
		if _, _, err := s.Reserve(ctx, kvroute.Lease{RequestID: id, Model: mdl, Replica: f.reps[0], PrefillBlocks: 1, DecodeBlocks: 1, Expires: time.Now().Add(time.Minute)}, loads[0].Version); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
		b.StopTimer()
		if _, err := s.Release(ctx, id); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	b.StopTimer()
	reportPercentiles(b, lat)
}

// BenchmarkPing is one loopback round trip, the floor of any Redis call.
func BenchmarkPing(b *testing.B) {
	s, _ := benchStore(b)
	ctx := context.Background()
	lat := make([]time.Duration, 0, b.N)
	for b.Loop() {
		t0 := time.Now()
		if err := s.Ping(ctx); err != nil {
			b.Fatal(err)
		}
		lat = append(lat, time.Since(t0))
	}
	b.StopTimer()
	reportPercentiles(b, lat)
}

// BenchmarkInMemoryLookup is the same question answered by an in-process
// index (key -> holder bitmap, one descent of the chain): what a router that
// keeps its own copy of the index pays, for the target's comparison.
func BenchmarkInMemoryLookup(b *testing.B) {
	f := newFleet(64, 2048)
	idx := map[kvroute.BlockKey]uint64{}
	for i, r := range f.reps {
		for _, k := range f.holds[r] {
			idx[k] |= 1 << i
		}
	}
	depth := make([]int, len(f.reps))
	for b.Loop() {
		alive := ^uint64(0)
		for d, k := range f.req {
			h := idx[k] & alive
			for gone := alive &^ h; gone != 0; gone &= gone - 1 {
				depth[bits.TrailingZeros64(gone)] = d
			}
			if alive = h; alive == 0 {
				break
			}
		}
		for ; alive != 0; alive &= alive - 1 {
			depth[bits.TrailingZeros64(alive)] = len(f.req)
		}
	}
}

// BenchmarkApply measures event ingestion: batches of 64 fresh blocks
// chained like a prompt's, as vLLM publishes them.
func BenchmarkApply(b *testing.B) {
	s, rc := benchStore(b)
	ctx := context.Background()
	rng := rand.New(rand.NewPCG(1, 1))
	var seq int64
	rc.ConfigResetStat(ctx)
	for b.Loop() {
		seq++
		k := chain(rng, 64)
		if _, err := s.Apply(ctx, mdl, "r0", seq, storeChain(k, 0, 64, kvroute.TierGPU)); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(64*b.N)/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(serverUsecPerCall(b, rc, "evalsha"), "redis-µs/op")
}

// BenchmarkMemory reports Redis used_memory per (replica, block) entry,
// engine-hash map included: "unique" has every block held by one replica,
// "shared8" has each block held by 8 replicas (a fleet serving the same
// prompts), "fleet" is BenchmarkLookup's 64x2048 corpus.
//
// The figure is meant per entry, so one-time costs are kept out of it: each
// run first warms the server up by loading the same corpus under a
// throwaway model (script cache, Lua heap, dict and allocator growth that
// FLUSHALL does not give back), flushes, and only then reads the baseline;
// unique and shared8 load over 100k entries so that what stays fixed (the
// model's few small keys) is negligible.
func BenchmarkMemory(b *testing.B) {
	for _, tc := range []struct {
		name            string
		reps, per, chns int
		share           int
	}{
		{"unique", 8, 1024, 100, 1},
		{"shared8", 8, 1024, 13, 8},
	} {
		b.Run(tc.name, func(b *testing.B) {
			for b.Loop() {
				s, rc := benchStore(b)
				load := func(model string) int {
					rng := rand.New(rand.NewPCG(2, 2))
					entries := 0
					for c := range tc.chns {
						k := chain(rng, tc.per)
						for j := range tc.share {
							r := "vllm-" + strconv.Itoa((c+j)%tc.reps)
							for from := 0; from < len(k); from += 512 {
								if _, err := s.Apply(context.Background(), model, r, int64(c*100+from+1), storeChain(k, from, from+512, kvroute.TierGPU)); err != nil {
									b.Fatal(err)
								}
							}
							entries += len(k)
						}
					}
					return entries
				}
				load("warmup")
				before := flushedMemory(b, rc)
				entries := load(mdl)
				b.ReportMetric(float64(usedMemory(b, rc)-before)/float64(entries), "B/entry")
			}
		})
	}
	b.Run("fleet", func(b *testing.B) {
		for b.Loop() {
			s, rc := benchStore(b)
			newFleet(64, 2048).loadAs(b, s, "warmup")
			before := flushedMemory(b, rc)
			n := newFleet(64, 2048).load(b, s)
			b.ReportMetric(float64(usedMemory(b, rc)-before)/float64(n), "B/entry")
		}
	})
}

// flushedMemory empties the warmed-up server and returns its used_memory.
func flushedMemory(b *testing.B, rc *redis.Client) int64 {
	b.Helper()
	if err := rc.FlushAll(context.Background()).Err(); err != nil {
		b.Fatal(err)
	}
	return usedMemory(b, rc)
}

func usedMemory(b *testing.B, rc *redis.Client) int64 {
	b.Helper()
	info, err := rc.Info(context.Background(), "memory").Result()
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(line, "used_memory:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n
		}
	}
	b.Fatal("no used_memory")
	return 0
}
