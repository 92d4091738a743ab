package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/router"
)

// replicaStub answers every proxied request in process, as a replica
// would, so that fuzzing the proxy needs no sockets.
type replicaStub struct{}

func (replicaStub) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Body != nil {
		_, _ = io.Copy(io.Discard, r.Body)
		r.Body.Close()
	}
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"application/json"}},
		Body: io.NopCloser(strings.NewReader(`{"choices":[{"text":"x"}],"usage":{"prompt_tokens":1}}`)), Request: r}, nil
}

// fuzzTargets are the handlers FuzzHandlers drives, picked by the input's
// first byte.
var fuzzTargets = []struct{ method, path string }{
	{http.MethodPost, "/v1/route"},
	{http.MethodPost, "/v1/completions"},
	{http.MethodPost, "/v1/chat/completions"},
	{http.MethodPut, "/v1/replicas/f"},
	{http.MethodPost, "/v1/route?redirect=false"},
	{http.MethodPost, "/v1/completions?redirect=true"},
}

// FuzzHandlers throws arbitrary bodies at the decision, proxy and admin
// handlers. Whatever the body: no 5xx but the ones a replica or the store
// explains, every error is JSON with an error object, and a replica the
// admin API accepted passes Validate and the address policy.
func FuzzHandlers(f *testing.F) {
	for _, h := range hostileInputs() {
		if len(h.body) > 4<<10 {
			// The huge ones are the table's; seeds this large only slow
			// the fuzzer's minimization down.
			continue
		}
		for i, t := range fuzzTargets {
			if strings.HasPrefix(h.path, t.path) && h.method == t.method {
				f.Add(uint8(i), []byte(h.body))
			}
		}
	}
	for i, body := range []string{
		`{"model":"m","token_ids":[1,2,3],"explain":true}`,
		`{"model":"m","prompt":[1,2,3],"stream":true}`,
		`{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
		`{"model":"m","url":"http://10.0.0.5:8000","labels":{"a":"b"}}`,
	} {
		f.Add(uint8(i), []byte(body))
	}
	mem := mock.NewMemory(kvroute.Replica{ID: "r0", Model: "m", URL: "http://10.0.0.1:8000"}, kvroute.Replica{ID: "r1", Model: "m", URL: "http://10.0.0.2:8000"})
	rt, err := router.New(mem.Index(), mem.Registry(), router.DefaultConfig(), router.Options{Rand: mrand.New(mrand.NewPCG(1, 2))})
	if err != nil {
		f.Fatal(err)
	}
	srv, err := api.New(api.Config{Router: rt, Registry: mem.Registry(), Logger: slog.New(slog.DiscardHandler),
		Transport: replicaStub{}, MaxBodyBytes: 64 << 10, MaxTokens: 4096})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		if len(body) > 64<<10 {
			return // 413, as TestHostileInputs checks
		}
		target := fuzzTargets[int(which)%len(fuzzTargets)]
		req := httptest.NewRequest(target.method, target.path, bytes.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		status, raw := rec.Code, rec.Body.Bytes()
		switch {
		case status >= 500 && status != http.StatusServiceUnavailable:
			t.Fatalf("%s %s %q: %d %s", target.method, target.path, body, status, raw)
		case status >= 400:
			var e struct {
				Error map[string]any `json:"error"`
			}
			if json.Unmarshal(raw, &e) != nil || e.Error["message"] == nil || e.Error["code"] == nil {
				t.Fatalf("%s %s %q: %d, not a JSON error: %s", target.method, target.path, body, status, raw)
			}
		}
		if target.method == http.MethodPut && status < 300 {
			rep, err := mem.Registry().GetReplica(context.Background(), "f")
			if err != nil {
				t.Fatal(err)
			}
			if err := rep.Validate(); err != nil {
				t.Fatalf("accepted %q, which fails Validate: %v", body, err)
			}
			if err := (kvroute.AddressPolicy{}).Check(rep); err != nil {
				t.Fatalf("accepted %q, which the address policy refuses: %v", body, err)
			}
			_ = mem.Registry().DeleteReplica(context.Background(), "f")
		}
	})
}
