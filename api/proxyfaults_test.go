package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/vllmtest"
)

// hungURL accepts requests and never answers them until the test ends: a
// wedged engine behind a live API server.
func hungURL(tb testing.TB) string {
	tb.Helper()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-r.Context().Done():
		case <-release:
		}
	}))
	// Cleanups run last first: the handlers return, then the server
	// closes.
	tb.Cleanup(srv.Close)
	tb.Cleanup(func() { close(release) })
	return srv.URL
}

// dyingURL answers with head (a status line's worth: headers sent, body
// started) and then closes the connection, as a replica dying mid-answer.
func dyingURL(tb testing.TB, contentType string, head string) string {
	tb.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", contentType)
		if contentType == "application/json" {
			w.Header().Set("Content-Length", fmt.Sprint(len(head)+100))
		}
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write([]byte(head))
		w.(http.Flusher).Flush()
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			panic(http.ErrAbortHandler)
		}
		conn.Close()
	}))
	tb.Cleanup(srv.Close)
	return srv.URL
}

// postWithin is h.post giving up after 10 s: without the proxy's bound
// a hung replica would hold the client until the test binary's timeout.
func (h *harness) postWithin(tb testing.TB, path, body string) (int, http.Header, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("POST %s: %v", path, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("POST %s: body: %v", path, err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

// TestProxyHeaderTimeout is issue 23's finding 2: a replica that accepted
// proxied requests and never answered them held them until the client
// gave up at 30 s, was never failed over nor marked suspect.
func TestProxyHeaderTimeout(t *testing.T) {
	for _, tc := range []struct {
		name, extra string
		// decodeTPS is the bound's decode speed: for a response that
		// streams, not in it; for one that does not, slower than the
		// live replica's (as the router's is the slow side), so that its
		// whole generation fits the bound (0.2 s + 1 x (40 tokens at
		// 2000/s + 16 at 20/s) = 1.02 s, the replica's taking 0.4 s).
		decodeTPS float64
	}{
		{"streaming", `,"stream":true`, 1},
		{"not streaming", ``, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The live replica generates for longer than the header
			// timeout (16 tokens at 40/s): a stream's attempt must live on
			// once its headers came.
			live, err := vllmtest.New(vllmtest.Config{Model: "m", DecodeTokensPerSec: 40})
			if err != nil {
				t.Fatal(err)
			}
			if err := live.Start(context.Background()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = live.Stop() })
			reg := prometheus.NewRegistry()
			h := newHarness(t, []kvroute.Replica{{ID: "hung", Model: "m", URL: hungURL(t)}, {ID: "live", Model: "m", URL: live.URL()}},
				withRegistry(t, reg), func(c *api.Config) {
					c.ProxyHeaderTimeout = 200 * time.Millisecond
					c.ProxyResponseFactor = 1
					c.DecodeTPS = tc.decodeTPS
				})
			// The live replica is busy, so the hung one wins the first
			// decision on cost.
			h.store.SetLoad("live", kvroute.Load{DecodeBlocks: 500, Requests: 20})
			for i := range 3 {
				body := `{"model":"m","prompt":` + tokenJSON(i*100, 40) + `,"max_tokens":16` + tc.extra + `}`
				status, hdr, raw := h.postWithin(t, "/v1/completions", body)
				if status != http.StatusOK {
					t.Fatalf("request %d: %d %s", i, status, raw)
				}
				if got := hdr.Get(api.HeaderReplica); got != "live" {
					t.Fatalf("request %d answered by %q, want live", i, got)
				}
				if tc.extra != "" && !strings.HasSuffix(raw, "data: [DONE]\n\n") {
					t.Fatalf("request %d: stream %q is not whole", i, raw)
				}
			}
			for _, name := range []string{"kvroute_proxy_header_timeouts_total", "kvroute_proxy_failovers_total"} {
				if got := testutil.ToFloat64(mustCounter(t, reg, name, "replica", "hung")); got != 1 {
					t.Errorf("%s{replica=hung} = %v, want 1 (then it was suspect)", name, got)
				}
			}
			if !h.rt.Suspect("hung") {
				t.Error("hung is not suspect")
			}
			if l := h.store.Load("hung"); l.Requests != 0 {
				t.Errorf("the hung booking was not released: %+v", l)
			}
		})
	}
}

// TestProxyHeaderTimeoutNoRetry: with no retry left the client gets a 502
// at the bound, not a wait until it gives up, and the replica is suspect.
func TestProxyHeaderTimeoutNoRetry(t *testing.T) {
	h := newHarness(t, []kvroute.Replica{{ID: "hung", Model: "m", URL: hungURL(t)}}, func(c *api.Config) {
		c.ProxyHeaderTimeout = 100 * time.Millisecond
		c.ProxyRetries = -1
	})
	status, _, raw := h.postWithin(t, "/v1/completions", `{"model":"m","prompt":[1,2,3],"stream":true}`)
	if status != http.StatusBadGateway || !strings.Contains(raw, "no response headers within 100ms") {
		t.Errorf("got %d %s, want 502 saying the headers did not come", status, raw)
	}
	if !h.rt.Suspect("hung") {
		t.Error("hung is not suspect")
	}
}

// TestProxyStreamCut is issue 23's finding 4: a replica dying mid-stream
// left the client a 200 and a cut chunked stream with no error event.
func TestProxyStreamCut(t *testing.T) {
	chunk := `data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"a","finish_reason":null}]}` + "\n\n"
	for _, tc := range []struct {
		name, head, want string
	}{
		{"cut between events", chunk + chunk, chunk + chunk},
		{"cut inside an event", chunk + `data: {"id":"cm`, chunk},
	} {
		t.Run(tc.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			h := newHarness(t, []kvroute.Replica{{ID: "dying", Model: "m", URL: dyingURL(t, "text/event-stream", tc.head)}}, withRegistry(t, reg))
			status, hdr, raw := h.post(t, "/v1/completions", `{"model":"m","prompt":[1,2,3],"stream":true}`)
			if status != http.StatusOK || hdr.Get(api.HeaderReplica) != "dying" {
				t.Fatalf("got %d from %q, want 200 from dying", status, hdr.Get(api.HeaderReplica))
			}
			rest, ok := strings.CutPrefix(raw, tc.want)
			if !ok {
				t.Fatalf("stream %q does not start with the whole events %q", raw, tc.want)
			}
			data, ok := strings.CutPrefix(rest, "data: ")
			if !ok || !strings.HasSuffix(data, "\n\n") {
				t.Fatalf("stream ends with %q, want one data event", rest)
			}
			var ev struct {
				Error *api.OpenAIErrorDetail `json:"error"`
			}
			if err := json.Unmarshal([]byte(data), &ev); err != nil || ev.Error == nil {
				t.Fatalf("last event %q is not an error (%v)", data, err)
			}
			if ev.Error.Type != "api_error" || ev.Error.Code != "upstream_error" || strings.Contains(ev.Error.Message, "dying") {
				t.Errorf("error event %+v, want api_error, upstream_error, no replica name", ev.Error)
			}
			if got := testutil.ToFloat64(mustCounter(t, reg, "kvroute_proxy_stream_errors_total", "replica", "dying")); got != 1 {
				t.Errorf("stream errors = %v, want 1", got)
			}
			if !h.rt.Suspect("dying") {
				t.Error("dying is not suspect")
			}
			if l := h.store.Load("dying"); l.Requests != 0 {
				t.Errorf("the cut booking was not released: %+v", l)
			}
		})
	}
	t.Run("not streaming", func(t *testing.T) {
		reg := prometheus.NewRegistry()
		h := newHarness(t, []kvroute.Replica{{ID: "dying", Model: "m", URL: dyingURL(t, "application/json", `{"id":"cmpl-1",`)}}, withRegistry(t, reg))
		resp, err := http.Post(h.srv.URL+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":[1,2,3]}`))
		if err != nil {
			t.Fatal(err)
		}
		_, rerr := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || rerr == nil {
			t.Errorf("got %d, body error %v; want 200 and a cut body", resp.StatusCode, rerr)
		}
		c := mustCounter(t, reg, "kvroute_proxy_stream_errors_total", "sse", "false")
		if got := testutil.ToFloat64(c); got != 1 {
			t.Errorf("stream errors (sse=false) = %v, want 1", got)
		}
		if !h.rt.Suspect("dying") {
			t.Error("dying is not suspect")
		}
	})
}
