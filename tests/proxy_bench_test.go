package tests_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/vllmtest"
)

// BenchmarkProxyTTFB measures what kvroute's proxy adds to a streamed
// completion's time to first byte: the same request (a 2,048-token prompt
// given as ids, 8 output tokens), sent to one simulated replica directly
// and through kvroute (decision over a real redis-server, booking, the
// reverse proxy, the progress reports), alternately in the same run.
// Target: added p50 <= 1 ms.
func BenchmarkProxyTTFB(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	rep, err := vllmtest.New(vllmtest.Config{Model: "m"})
	if err != nil {
		b.Fatal(err)
	}
	if err := rep.Start(ctx); err != nil {
		b.Fatal(err)
	}
	defer rep.Stop()
	a, err := app.New(ctx, app.Config{Listen: "127.0.0.1:0", RedisURL: redistest.Server(b), Router: router.DefaultConfig(), Tokenizers: app.Tokenizers{NoRemote: true}})
	if err != nil {
		b.Fatal(err)
	}
	if err := a.Start(); err != nil {
		b.Fatal(err)
	}
	defer a.Stop()
	// Registered with its event endpoints, as a production replica is (no
	// ingestor runs here: the prompt is never cached, and each decision
	// costs its two store round trips).
	status, body := doJSON(b, http.MethodPut, "http://"+a.Addr()+"/v1/replicas/r0",
		fmt.Sprintf(`{"model":"m","url":%q,"events":%q,"replay":%q}`, rep.URL(), rep.EventsEndpoint(), rep.ReplayEndpoint()))
	if status != http.StatusCreated {
		b.Fatalf("register: %d %s", status, body)
	}

	var prompt bytes.Buffer
	prompt.WriteString(`{"model":"m","stream":true,"max_tokens":8,"prompt":[`)
	for i := range 2048 {
		if i > 0 {
			prompt.WriteByte(',')
		}
		fmt.Fprint(&prompt, 1000+i)
	}
	prompt.WriteString(`]}`)
	reqBody := prompt.Bytes()
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	ttfb := func(base string) time.Duration { return firstByte(b, client, base+"/v1/completions", reqBody) }
	routeBody := bytes.Replace(reqBody, []byte(`"stream":true,"max_tokens":8,"prompt":`), []byte(`"max_tokens":8,"token_ids":`), 1)
	decide := func() time.Duration {
		start := time.Now()
		status, body := doJSON(b, http.MethodPost, "http://"+a.Addr()+"/v1/route", string(routeBody))
		if status != http.StatusOK {
			b.Fatalf("route: %d %s", status, body)
		}
		return time.Since(start)
	}
	kv, direct := "http://"+a.Addr(), rep.URL()
	ttfb(kv)
	ttfb(direct)
	var via, straight, decisions latencies
	b.ResetTimer()
	for b.Loop() {
		via = append(via, ttfb(kv))
		straight = append(straight, ttfb(direct))
		decisions = append(decisions, decide())
	}
	b.StopTimer()
	b.ReportMetric(float64(decisions.p50().Microseconds()), "decision-p50-µs")
	b.ReportMetric(float64(via.p50().Microseconds()), "proxied-p50-µs")
	b.ReportMetric(float64(straight.p50().Microseconds()), "direct-p50-µs")
	b.ReportMetric(float64((via.p50() - straight.p50()).Microseconds()), "added-p50-µs")
}

// firstByte posts body to url, returns the time to the response's first
// byte, and drains the rest (so the connection is reused).
func firstByte(b *testing.B, client *http.Client, url string, body []byte) time.Duration {
	b.Helper()
	start := time.Now()
	resp, err := client.Post(url, "application/json", bytes.NewReader(body))
	if err != nil {
		b.Fatal(err)
	}
	defer resp.Body.Close()
	r := bufio.NewReader(resp.Body)
	if _, err := r.ReadByte(); err != nil {
		b.Fatal(err)
	}
	took := time.Since(start)
	if resp.StatusCode != http.StatusOK {
		b.Fatalf("status %d", resp.StatusCode)
	}
	_, _ = io.Copy(io.Discard, r)
	return took
}

// doJSON sends one JSON request and returns the status and body.
func doJSON(tb testing.TB, method, url, body string) (int, string) {
	tb.Helper()
	req, err := http.NewRequest(method, url, bytes.NewReader([]byte(body)))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	var out bytes.Buffer
	_, _ = out.ReadFrom(resp.Body)
	return resp.StatusCode, out.String()
}
