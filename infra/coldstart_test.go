package infra_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/vllmtest"
)

// The cold start scale-to-zero costs, the process part of it: a fresh
// `kvroute serve` against a Redis whose index already holds the prompt
// (written by an ingestor following a replica, as in production), timed
// from exec to the first /v1/route answer whose matched_blocks is above
// zero. Kubernetes adds scheduling, the image pull and the readiness
// probe's period on top (infra/README.md).
//
//	go test -run '^$' -bench BenchmarkColdStart -benchtime 20x ./infra

const (
	coldModel  = "cold"
	coldBlocks = 8
	coldBS     = 16
)

// warmFleet is a Redis, a simulated replica holding the prompt, and an
// ingestor that has written the replica's blocks into the index; no
// scoring pod is left running.
type warmFleet struct {
	redisURL string
	body     string // the /v1/route request for the prompt
}

func newWarmFleet(tb testing.TB) warmFleet {
	tb.Helper()
	// The binary is built before the clock starts: under `make test` the
	// build shares two CPUs with every other package's tests and has taken
	// most of a minute.
	kvrouteBinary(tb)
	redisURL := redistest.Server(tb)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()

	rep, err := vllmtest.New(vllmtest.Config{Model: coldModel, BlockSize: coldBS})
	if err != nil {
		tb.Fatal(err)
	}
	if err := rep.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = rep.Stop() })

	startProc(tb, "ingest", "--redis-url", redisURL, "--owner", "infra-ingest-0",
		"--metrics-listen", freeAddr(tb), "--health-interval", "200ms", "--metrics-interval", "200ms")

	// The first scoring pod registers the replica, as an operator would.
	addr := freeAddr(tb)
	first := startProc(tb, "serve", "--listen", addr, "--redis-url", redisURL)
	base := "http://" + addr
	waitHTTP(tb, first, base+"/readyz", 30*time.Second)
	reg := fmt.Sprintf(`{"model":%q,"url":%q,"events":%q,"replay":%q}`, coldModel, rep.URL(), rep.EventsEndpoint(), rep.ReplayEndpoint())
	if code, b, err := call(ctx, http.MethodPut, base+"/v1/replicas/r0", reg); err != nil || (code != http.StatusOK && code != http.StatusCreated) {
		tb.Fatalf("register replica: %d %s %v", code, b, err)
	}
	if err := rep.WaitSubscribed(ctx); err != nil {
		tb.Fatalf("the ingestor never subscribed to the replica: %v", err)
	}
	tokens := make([]int, coldBlocks*coldBS+3)
	for i := range tokens {
		tokens[i] = 1000 + i
	}
	if _, err := rep.Admit(tokens, ""); err != nil {
		tb.Fatal(err)
	}
	ids, _ := json.Marshal(tokens)
	body := fmt.Sprintf(`{"model":%q,"token_ids":%s}`, coldModel, ids)
	for {
		d, err := route(ctx, base, body)
		if err == nil && d.MatchedBlocks == coldBlocks {
			break
		}
		if ctx.Err() != nil {
			tb.Fatalf("the index never held the prompt: last decision %+v, %v", d, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Scaled to zero: the index outlives every scoring pod.
	first.stop()
	return warmFleet{redisURL: redisURL, body: body}
}

// coldStart starts a fresh scoring pod and returns the time from exec to
// its first HTTP answer of any kind and to its first matching decision.
func (f warmFleet) coldStart(tb testing.TB) (firstAnswer, firstMatch time.Duration) {
	tb.Helper()
	addr := freeAddr(tb)
	base := "http://" + addr
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	p := startProc(tb, "serve", "--listen", addr, "--redis-url", f.redisURL, "--log-level", "warn")
	defer p.stop()
	for {
		d, err := route(ctx, base, f.body)
		if err == nil && firstAnswer == 0 {
			firstAnswer = time.Since(start)
		}
		if err == nil && d.MatchedBlocks > 0 {
			if d.MatchedBlocks != coldBlocks {
				tb.Errorf("first decision matched %d blocks, want %d", d.MatchedBlocks, coldBlocks)
			}
			return firstAnswer, time.Since(start)
		}
		if ctx.Err() != nil {
			tb.Fatalf("no matching decision within 30 s: last %+v, %v\n%s", d, err, p.logs())
		}
		// Polling granularity: well under the figure measured.
		time.Sleep(500 * time.Microsecond)
	}
}

func TestColdStart(t *testing.T) {
	f := newWarmFleet(t)
	answer, match := f.coldStart(t)
	t.Logf("fresh kvroute serve: first decision %v after exec, first matching decision %v", answer.Round(time.Microsecond), match.Round(time.Microsecond))
}

func BenchmarkColdStart(b *testing.B) {
	f := newWarmFleet(b)
	var matches []time.Duration
	for b.Loop() {
		_, m := f.coldStart(b)
		matches = append(matches, m)
	}
	slices.Sort(matches)
	b.ReportMetric(float64(matches[len(matches)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(matches[len(matches)-1].Microseconds())/1000, "max-ms")
}
