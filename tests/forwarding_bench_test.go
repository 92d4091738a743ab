package tests_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/testfiles"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenizer/qwen3"
	"github.com/kvroute/kvroute/vllmtest"
)

// BenchmarkTokenForwarding measures what forwarding kvroute's token ids
// saves the engine: a streamed completion whose prompt is ~32k tokens of
// prose, through two kvroute pods over one real Redis, one forwarding its
// ids (the default) and one forwarding the text (--token-forwarding=false),
// to the same simulated replica, which tokenizes text with the real Qwen3
// tokenizer as vLLM would (and parses ids when given ids). Reported: time
// to first byte of each, alternately in the same run. The replica's
// prefill is instantaneous, so the difference is the replica's prompt
// handling alone; vLLM's own tokenizer (Hugging Face's, through Python)
// costs more per token than this one (see BENCHMARKS.md).
func BenchmarkTokenForwarding(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	qtok, err := qwen3.Load()
	if err != nil {
		b.Fatal(err)
	}
	rep, err := vllmtest.New(vllmtest.Config{Model: "m", Tokenizer: qtok, MaxModelLen: 1 << 17, CapacityBlocks: 1 << 16})
	if err != nil {
		b.Fatal(err)
	}
	if err := rep.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer rep.Stop()
	url := redistest.Server(b)
	pod := func(noForward bool) string {
		a, err := app.New(ctx, app.Config{Listen: "127.0.0.1:0", RedisURL: url, Router: router.DefaultConfig(),
			Tokenizers: app.Tokenizers{FS: map[string]fs.FS{"m": qwen3.FS}, NoRemote: true, NoTokenForwarding: noForward,
				VerifyMatches: -1}}) // the files are the replica's own: no check needed
		if err != nil {
			b.Fatal(err)
		}
		if err := a.Start(); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = a.Stop() })
		return "http://" + a.Addr()
	}
	forwarding, text := pod(false), pod(true)
	status, body := doJSON(b, http.MethodPut, forwarding+"/v1/replicas/r0",
		fmt.Sprintf(`{"model":"m","url":%q,"events":%q}`, rep.URL(), rep.EventsEndpoint()))
	if status != http.StatusCreated {
		b.Fatalf("register: %d %s", status, body)
	}
	raw, err := os.ReadFile(filepath.Join(testfiles.Root(), "tokenizer", "testdata", "prose.txt"))
	if err != nil {
		b.Fatal(err)
	}
	prose := strings.Repeat(string(raw), 5) // ~140 KB, ~32k tokens
	ids, _ := qtok.Encode(prose, true)
	b.Logf("prompt: %d bytes, %d tokens", len(prose), len(ids))

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	ttfb := func(base string, n int) time.Duration {
		// A different first word each time, so no prompt is cached.
		req, _ := json.Marshal(map[string]any{"model": "m", "prompt": fmt.Sprintf("Run %d. ", n) + prose, "max_tokens": 1, "stream": true})
		return firstByte(b, client, base+"/v1/completions", req)
	}
	ttfb(forwarding, -1)
	ttfb(text, -2)
	var fw, tx latencies
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		fw = append(fw, ttfb(forwarding, 2*i))
		tx = append(tx, ttfb(text, 2*i+1))
	}
	b.StopTimer()
	b.ReportMetric(float64(fw.p50().Microseconds()), "ids-forwarded-p50-µs")
	b.ReportMetric(float64(tx.p50().Microseconds()), "text-forwarded-p50-µs")
	b.ReportMetric(float64((tx.p50() - fw.p50()).Microseconds()), "saved-p50-µs")
}
