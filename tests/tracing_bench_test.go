package tests_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/store"
)

// BenchmarkTracingOverhead measures what tracing costs a decision: two
// in-process pods over one real redis-server and one fleet (16 replicas,
// a 64-block prompt a quarter of them hold in part), one with tracing
// off (no exporter: the no-op provider) and one exporting every span
// (OTEL_TRACES_SAMPLER=always_on, batch processor) over OTLP/HTTP to an
// in-test receiver on loopback, which decodes every export. Decisions
// (POST /v1/route, as a client sees them) alternate between the two pods,
// so that both see the same machine and the same Redis; the release is
// not timed. Target: on-p50 <= 1.1 × off-p50.
func BenchmarkTracingOverhead(b *testing.B) {
	ctx := context.Background()
	url := redistest.Server(b)
	st, err := store.Open(ctx, url, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	prompt, _, _ := fleetCorpus(b, ctx, st, 16, 64)
	body, _ := json.Marshal(map[string]any{"model": "bench", "token_ids": prompt})

	rcv := newOTLPReceiver(b)
	pod := func(env map[string]string) string {
		for k, v := range env {
			b.Setenv(k, v)
		}
		rc := router.DefaultConfig()
		a, err := app.New(ctx, app.Config{Listen: "127.0.0.1:0", RedisURL: url, Router: rc})
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = a.Stop() })
		return "http://" + a.Addr()
	}
	off := pod(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "", "OTEL_TRACES_SAMPLER": ""})
	on := pod(map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://" + rcv.HTTPAddr,
		"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf", "OTEL_TRACES_SAMPLER": "always_on"})
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	decide := func(base string) time.Duration {
		t0 := time.Now()
		resp, err := client.Post(base+"/v1/route", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(t0)
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("route: %d %s", resp.StatusCode, raw)
		}
		var d struct {
			RequestID string `json:"request_id"`
		}
		_ = json.Unmarshal(raw, &d)
		rel, err := client.Post(base+"/v1/requests/"+d.RequestID+"/release", "application/json", strings.NewReader(""))
		if err != nil {
			b.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, rel.Body)
		rel.Body.Close()
		return took
	}
	for range 200 { // warm both: connections, script caches, registry caches
		decide(off)
		decide(on)
	}
	var tOff, tOn latencies
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if i%2 == 0 {
			tOff = append(tOff, decide(off))
		} else {
			tOn = append(tOn, decide(on))
		}
	}
	b.StopTimer()
	if len(tOff) == 0 || len(tOn) == 0 {
		return
	}
	ratio := float64(tOn.p50()) / float64(tOff.p50())
	b.ReportMetric(float64(tOff.p50().Microseconds()), "off-p50-µs")
	b.ReportMetric(float64(tOn.p50().Microseconds()), "on-p50-µs")
	b.ReportMetric(ratio, "on/off-p50")
	// The receiver must have been sent the spans: the figure is for
	// tracing that exports, not tracing that drops.
	deadline := time.Now().Add(5 * time.Second)
	for len(rcv.all()) == 0 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if len(rcv.all()) == 0 {
		b.Fatal("no spans reached the receiver")
	}
	if os.Getenv("KVROUTE_BENCH_STRICT") != "" && ratio > 1.1 {
		b.Errorf("tracing on costs %.2f× the decision p50 (on %v, off %v), over the 1.1× target", ratio, tOn.p50(), tOff.p50())
	}
	b.Logf("%d decisions each: off p50 %v, on p50 %v (%.3f×); %d spans exported in %d requests",
		len(tOff), tOff.p50(), tOn.p50(), ratio, len(rcv.all()), rcv.requestCount())
}

func (rcv *otlpReceiver) requestCount() int {
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	return rcv.requests
}
