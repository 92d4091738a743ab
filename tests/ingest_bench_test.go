package tests_test

import (
	"math/rand/v2"
	"net/url"
	"os/exec"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute/sim/replica"
)

// BenchmarkIngest measures event ingestion end to end: simulated replicas
// publish real ZeroMQ event batches, the ingestor decodes and translates
// them and applies each batch to a real redis-server. In the same run,
// redis-benchmark's pipelined HSET rate on the same server is the yardstick
// (target: ingestion >= 0.3 of it, in blocks/s vs HSETs/s).
func BenchmarkIngest(b *testing.B) {
	const (
		nRep      = 4
		perPrompt = 32 // blocks per admitted prompt: one BlockStored each
		prompts   = 400
	)
	for b.Loop() {
		b.StopTimer()
		h := newHarness(b)
		for i := range nRep {
			h.addReplica("r"+strconv.Itoa(i), replica.Config{CapacityBlocks: 1 << 20})
		}
		ing, _ := h.startIngestor("bench", h.openStore())
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
		for i := range nRep {
			h.synced("r" + strconv.Itoa(i))
		}
		elapsed := time.Since(start)
		b.StopTimer()
		blocks := float64(nRep * prompts * perPrompt)
		rate := blocks / elapsed.Seconds()
		hset := redisBenchmarkHSET(b, h.url)
		b.ReportMetric(rate, "blocks/s")
		b.ReportMetric(hset, "redis-bench-hset/s")
		b.ReportMetric(rate/hset, "x-hset")
		b.StartTimer()
	}
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
