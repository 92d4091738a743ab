package tests_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/vllmtest"
)

// simReplica starts a simulated replica of model m for the test.
func simReplica(t *testing.T, cfg vllmtest.Config) *vllmtest.Replica {
	t.Helper()
	cfg.Model = "m"
	r, err := vllmtest.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Stop() })
	return r
}

// register puts each replica (id: URL) in p's registry.
func (p *process) register(t *testing.T, reps map[string]string) {
	t.Helper()
	for id, url := range reps {
		if status, _, raw := p.send(t, http.MethodPut, "/v1/replicas/"+id, fmt.Sprintf(`{"model":"m","url":%q}`, url)); status != http.StatusCreated {
			t.Fatalf("register %s: %d %s", id, status, raw)
		}
	}
}

// TestProxyHungReplica is issue 23's finding 2 against `kvroute serve`: a
// replica that answers /health but never answers a proxied request held
// 4 of 24 requests until the client gave up at 30 s, and kept getting
// traffic. Now the first request it gets fails over at the bound, and it
// is suspect for the rest.
func TestProxyHungReplica(t *testing.T) {
	p := startServe(t, "--proxy-header-timeout", "300ms")
	hung := simReplica(t, vllmtest.Config{})
	hung.HangBeforeHeaders(true)
	live := simReplica(t, vllmtest.Config{})
	p.register(t, map[string]string{"r0-hung": hung.URL(), "r1-live": live.URL()})
	for i := range 24 {
		stream := i%2 == 1
		body := fmt.Sprintf(`{"model":"m","prompt":[%d,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"max_tokens":4,"stream":%t}`, 1000+i, stream)
		start := time.Now()
		// p.post gives up after 10 s; the bound is 0.3 s for a stream
		// and 0.3 s + 3 x (17 tokens at 2000/s + 4 at 10/s) = 1.6 s for
		// the others; 5 s is slack for a loaded machine.
		status, hdr, raw := p.post(t, "/v1/completions", body)
		took := time.Since(start)
		if status != http.StatusOK || hdr.Get("X-Kvroute-Replica") != "r1-live" || took > 5*time.Second {
			t.Fatalf("request %d (stream %t): %d from %q after %v: %s", i, stream, status, hdr.Get("X-Kvroute-Replica"), took, raw)
		}
		if stream && !strings.HasSuffix(raw, "data: [DONE]\n\n") {
			t.Fatalf("request %d: stream %q is not whole", i, raw)
		}
	}
	_, metrics := p.get(t, "/metrics")
	// Once: then it was suspect and no decision chose it.
	for _, series := range []string{`kvroute_proxy_header_timeouts_total{replica="r0-hung"}`, `kvroute_proxy_failovers_total{replica="r0-hung"}`} {
		if got := sumSeries(metrics, series); got != 1 {
			t.Errorf("%s = %v, want 1", series, got)
		}
	}
	checkLate(t, metrics, "kvroute_proxy_header_timeouts_total")
}

// TestProxyReplicaDiesMidStream is issue 23's finding 4 against `kvroute
// serve`: a replica dying mid-stream left the client a 200 and a cut
// chunked stream (curl exit 18) with no error event.
func TestProxyReplicaDiesMidStream(t *testing.T) {
	p := startServe(t)
	dying := simReplica(t, vllmtest.Config{})
	dying.DieMidResponse(2)
	p.register(t, map[string]string{"dying": dying.URL()})
	status, _, raw := p.post(t, "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":5,"stream":true}`)
	if status != http.StatusOK {
		t.Fatalf("got %d %s, want a 200 stream", status, raw)
	}
	events := strings.SplitAfter(raw, "\n\n")
	if len(events) != 4 || events[3] != "" {
		t.Fatalf("stream %q: want the replica's two events, an error event and a clean end", raw)
	}
	var ev struct {
		Error *struct{ Message, Type, Code string } `json:"error"`
	}
	data, _ := strings.CutPrefix(events[2], "data: ")
	if err := json.Unmarshal([]byte(data), &ev); err != nil || ev.Error == nil || ev.Error.Code != "upstream_error" || ev.Error.Type != "api_error" {
		t.Fatalf("last event %q (%v), want an OpenAI error, api_error, upstream_error", events[2], err)
	}
	if strings.Contains(ev.Error.Message, "dying") {
		t.Errorf("the error names the replica: %q", ev.Error.Message)
	}
	_, metrics := p.get(t, "/metrics")
	if got := sumSeries(metrics, `kvroute_proxy_stream_errors_total{replica="dying",sse="true"}`); got != 1 {
		t.Errorf("stream errors = %v, want 1", got)
	}
	checkLate(t, metrics, "kvroute_proxy_stream_errors_total")
}

// checkLate holds a series served once its event happened to its entry in
// lateSeries (TestMetricNames pins the others in metrics.golden).
func checkLate(t *testing.T, metrics, name string) {
	t.Helper()
	if got, want := describeFamilies(t, metrics)[name], lateSeries[name]; got != want {
		t.Errorf("%s:\n\tgot  %s\n\twant %s", name, got, want)
	}
}
