package tests_test

import (
	"context"
	"math/rand/v2"
	"net/url"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/internal/telemetry"
	"github.com/kvroute/kvroute/vllmtest"
)

// BenchmarkIngest measures event ingestion end to end: simulated replicas
// publish real ZeroMQ event batches, the ingestor decodes and translates
// them and applies each batch to a real redis-server. In the same run,
// redis-benchmark's pipelined HSET rate on the same server is the yardstick
// (target: ingestion >= 0.3 of it, in blocks/s vs HSETs/s). Both swing
// by up to 1.5x from one moment to the next on these machines, so each
// iteration measures both, back to back, and the medians over iterations
// are reported (run with -benchtime 3x or more).
func BenchmarkIngest(b *testing.B) {
	const (
		nRep      = 4
		perPrompt = 32   // blocks per admitted prompt: one BlockStored each
		prompts   = 1200 // per replica: 153,600 blocks, about a second
	)
	var rates, hsets, ratios []float64
	for b.Loop() {
		b.StopTimer()
		h := newHarness(b)
		for i := range nRep {
			h.addReplica("r"+strconv.Itoa(i), vllmtest.Config{CapacityBlocks: 1 << 20})
		}
		reg := prometheus.NewRegistry()
		mp, err := telemetry.NewMeterProvider(reg)
		if err != nil {
			b.Fatal(err)
		}
		ing, _ := h.startIngestor("bench", h.openStore(), func(c *ingestor.Config) { c.MeterProvider = mp })
		h.waitOwned(ing)
		r := rand.New(rand.NewPCG(1, 2))
		work := make([][][]int, nRep)
		for i := range work {
			for range prompts {
				work[i] = append(work[i], prompt(r, nil, perPrompt*bs))
			}
		}
		b.StartTimer()
		start := time.Now()
		done := make(chan struct{}, nRep)
		for i := range nRep {
			go func() {
				rep := h.reps["r"+strconv.Itoa(i)]
				for _, p := range work[i] {
					if _, err := rep.Admit(p, ""); err != nil {
						b.Error(err)
					}
				}
				done <- struct{}{}
			}()
		}
		for range nRep {
			<-done
		}
		admitted := time.Since(start)
		// Poll every millisecond, not at waitFor's 20 ms: the poll's
		// granularity is part of the measured time.
		h.poll = time.Millisecond
		for i := range nRep {
			h.synced("r" + strconv.Itoa(i))
		}
		elapsed := time.Since(start)
		b.StopTimer()
		blocks := float64(nRep * prompts * perPrompt)
		rate := blocks / elapsed.Seconds()
		// Batches dropped on the way (a full ZeroMQ queue) would be
		// replayed, and the rate would include recovery work.
		if n := counter(b, reg, "kvroute_ingest_gaps_total"); n != 0 {
			b.Logf("%v gaps, %v batches replayed", n, counter(b, reg, "kvroute_ingest_replayed_batches_total"))
		}
		evalUS := scriptMicros(b, h.url)
		hset := redisBenchmarkHSET(b, h.url)
		b.Logf("%.0f blocks/s (replicas done after %v of %v; scripts %.2f µs of Redis time a block), redis-benchmark %.0f HSET/s: %.3f",
			rate, admitted.Round(time.Millisecond), elapsed.Round(time.Millisecond), evalUS/blocks, hset, rate/hset)
		rates, hsets, ratios = append(rates, rate), append(hsets, hset), append(ratios, rate/hset)
		b.StartTimer()
	}
	b.ReportMetric(median(rates), "blocks/s")
	b.ReportMetric(median(hsets), "redis-bench-hset/s")
	b.ReportMetric(median(ratios), "x-hset")
}

var usecRe = regexp.MustCompile(`cmdstat_evalsha:calls=\d+,usec=(\d+)`)

// scriptMicros returns the Redis time spent in EVALSHA so far, in µs.
func scriptMicros(tb testing.TB, rawURL string) float64 {
	tb.Helper()
	opt, err := redis.ParseURL(rawURL)
	if err != nil {
		tb.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	m := usecRe.FindStringSubmatch(info)
	if m == nil {
		tb.Fatalf("no evalsha in commandstats:\n%s", info)
	}
	v, _ := strconv.ParseFloat(m[1], 64)
	return v
}

// counter reads one counter (summed over its labels) from reg.
func counter(tb testing.TB, reg *prometheus.Registry, name string) float64 {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() == name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

var rpsRe = regexp.MustCompile(`([0-9.]+) requests per second`)

// redisBenchmarkHSET runs redis-benchmark's pipelined HSET (16 deep, 4
// clients) against the server at rawURL and returns requests per second.
func redisBenchmarkHSET(tb testing.TB, rawURL string) float64 {
	tb.Helper()
	u, err := url.Parse(rawURL)
	if err != nil {
		tb.Fatal(err)
	}
	out, err := exec.Command("redis-benchmark", "-h", u.Hostname(), "-p", u.Port(), "-t", "hset", "-P", "16", "-c", "4", "-n", "400000", "-q").CombinedOutput()
	if err != nil {
		tb.Fatalf("redis-benchmark: %v\n%s", err, out)
	}
	m := rpsRe.FindSubmatch(out)
	if m == nil {
		tb.Fatalf("redis-benchmark: no rate in %q", out)
	}
	v, _ := strconv.ParseFloat(string(m[1]), 64)
	return v
}
