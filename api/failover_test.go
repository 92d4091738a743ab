package api_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/vllmtest"
)

// deadURL is a loopback port nobody listens on: connections are refused.
func deadURL(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return "http://" + addr
}

// resetURL accepts connections and closes them before any response: a
// replica crashing under the request.
func resetURL(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			buf := make([]byte, 512)
			_, _ = c.Read(buf)
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetLinger(0) // RST, not FIN
			}
			c.Close()
		}
	}()
	return "http://" + ln.Addr().String()
}

func liveReplica(tb testing.TB) *vllmtest.Replica {
	tb.Helper()
	r, err := vllmtest.New(vllmtest.Config{Model: "m"})
	if err != nil {
		tb.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = r.Stop() })
	return r
}

// TestProxyFailover is the finding: a dead replica got 7 of 40 proxied
// requests as 502s until the health probe marked it, ~10 s later.
func TestProxyFailover(t *testing.T) {
	for _, tc := range []struct{ name, url string }{
		{"connection refused", deadURL(t)},
		{"reset before headers", resetURL(t)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			live := liveReplica(t)
			reg := prometheus.NewRegistry()
			h := newHarness(t, []kvroute.Replica{{ID: "dead", Model: "m", URL: tc.url}, {ID: "live", Model: "m", URL: live.URL()}},
				withRegistry(t, reg))
			// The live replica is busy, so the dead one wins the first
			// decision on cost.
			h.store.SetLoad("live", kvroute.Load{DecodeBlocks: 500, Requests: 20})
			for i := range 40 {
				body := `{"model":"m","prompt":` + tokenJSON(i*100, 40) + `,"max_tokens":4}`
				status, hdr, raw := h.post(t, "/v1/completions", body)
				if status != http.StatusOK {
					t.Fatalf("request %d: %d %s", i, status, raw)
				}
				if got := hdr.Values(api.HeaderReplica); len(got) != 1 || got[0] != "live" {
					t.Fatalf("request %d answered by %q, want live", i, got)
				}
			}
			if got := testutil.ToFloat64(mustCounter(t, reg, "kvroute_proxy_failovers_total", "replica", "dead")); got != 1 {
				t.Errorf("failovers from dead = %v, want 1 (then it was suspect)", got)
			}
			if !h.rt.Suspect("dead") {
				t.Error("dead is not suspect")
			}
			if l := h.store.Load("dead"); l.Requests != 0 || l.PrefillBlocks != 0 || l.DecodeBlocks != 0 {
				t.Errorf("the failed booking was not released: %+v", l)
			}
		})
	}
}

func TestProxyUpstreamErrorShape(t *testing.T) {
	h := newHarness(t, []kvroute.Replica{{ID: "dead", Model: "m", URL: deadURL(t)}})
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		t.Run(path, func(t *testing.T) {
			body := `{"model":"m","prompt":[1,2,3]}`
			if strings.Contains(path, "chat") {
				body = `{"model":"m","messages":[{"role":"user","content":"hi"}]}`
			}
			status, hdr, raw := h.post(t, path, body)
			if status != http.StatusBadGateway {
				t.Fatalf("status %d, want 502: %s", status, raw)
			}
			// The error answer still says which decision failed.
			if got := hdr.Get(api.HeaderReplica); got != "dead" || hdr.Get(api.HeaderRequestID) == "" {
				t.Errorf("decision headers: replica %q, request id %q; want dead and an id", got, hdr.Get(api.HeaderRequestID))
			}
			var got map[string]map[string]any
			if err := json.Unmarshal([]byte(raw), &got); err != nil {
				t.Fatal(err)
			}
			e := got["error"]
			for _, k := range []string{"message", "type", "param", "code"} {
				if _, ok := e[k]; !ok {
					t.Errorf("error lacks %q: %s", k, raw)
				}
			}
			if e["type"] != "api_error" || e["code"] != "upstream_error" || e["param"] != nil {
				t.Errorf("error = %v", e)
			}
		})
	}
}

// TestOpenAIRedirect: ?redirect=true on an OpenAI endpoint answers 307 to
// the replica's same path, for the client to re-post its own body.
func TestOpenAIRedirect(t *testing.T) {
	h := newHarness(t, []kvroute.Replica{{ID: "r0", Model: "m", URL: "http://replica-0:8000/base"}})
	for _, tt := range []struct{ path, body, want string }{
		{"/v1/completions?redirect=true", `{"model":"m","prompt":[1,2,3],"stream":true}`, "http://replica-0:8000/base/v1/completions"},
		{"/v1/chat/completions?redirect=true&x=1", `{"model":"m","token_ids":[1],"messages":[]}`, "http://replica-0:8000/base/v1/chat/completions?x=1"},
	} {
		t.Run(tt.path, func(t *testing.T) {
			status, hdr, raw := h.post(t, tt.path, tt.body)
			if status != http.StatusTemporaryRedirect {
				t.Fatalf("status %d, want 307: %s", status, raw)
			}
			if got := hdr.Get("Location"); got != tt.want {
				t.Errorf("Location = %q, want %q", got, tt.want)
			}
			got := decodeJSON[api.RouteResponse](t, raw)
			if hdr.Get(api.HeaderRequestID) != got.RequestID || hdr.Get(api.HeaderReplica) != "r0" {
				t.Errorf("decision headers %q %q, body %s", hdr.Get(api.HeaderRequestID), hdr.Get(api.HeaderReplica), raw)
			}
			// The booking stays for the client to release (or to expire).
			if _, ok := h.store.Lease(got.RequestID); !ok {
				t.Error("the redirected decision booked nothing")
			}
		})
	}
	t.Run("strict boolean", func(t *testing.T) {
		status, _, raw := h.post(t, "/v1/completions?redirect=yes", `{"model":"m","prompt":[1]}`)
		if status != http.StatusBadRequest || errorField(t, raw) != "redirect" {
			t.Errorf("got %d %s, want 400 naming redirect", status, raw)
		}
	})
}
