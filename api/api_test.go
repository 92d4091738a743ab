package api_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
)

func fleet(n int, model string) []kvroute.Replica {
	out := make([]kvroute.Replica, n)
	for i := range out {
		out[i] = kvroute.Replica{ID: fmt.Sprintf("r%d", i), Model: model, URL: fmt.Sprintf("http://replica-%d:8000", i)}
	}
	return out
}

// tokenJSON renders n token ids starting at from as a JSON array.
func tokenJSON(from, n int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprint(&b, from+i)
	}
	b.WriteByte(']')
	return b.String()
}

func decodeJSON[T any](tb testing.TB, body string) T {
	tb.Helper()
	var v T
	if err := json.Unmarshal([]byte(body), &v); err != nil {
		tb.Fatalf("decode %q: %v", body, err)
	}
	return v
}

func TestRoute(t *testing.T) {
	h := newHarness(t, fleet(2, "m"))
	body := `{"model":"m","token_ids":` + tokenJSON(0, 64) + `}`

	t.Run("decision", func(t *testing.T) {
		status, hdr, raw := h.post(t, "/v1/route", body)
		if status != http.StatusOK {
			t.Fatalf("status = %d, want 200; body %s", status, raw)
		}
		got := decodeJSON[api.RouteResponse](t, raw)
		if got.RequestID == "" || got.Replica.ID == "" || got.Replica.URL == "" {
			t.Errorf("decision lacks request or replica: %+v", got)
		}
		if got.PromptBlocks != 4 || got.BlockSize != 16 || got.Policy != "kv" || got.Degraded {
			t.Errorf("got blocks=%d size=%d policy=%q degraded=%v, want 4 16 kv false", got.PromptBlocks, got.BlockSize, got.Policy, got.Degraded)
		}
		if got.ExpiresAt.IsZero() {
			t.Error("expires_at is missing")
		}
		if got.Candidates != nil {
			t.Errorf("candidates without explain: %v", got.Candidates)
		}
		if hdr.Get(api.HeaderRequestID) != got.RequestID || hdr.Get(api.HeaderReplica) != got.Replica.ID {
			t.Errorf("headers %q %q, want %q %q", hdr.Get(api.HeaderRequestID), hdr.Get(api.HeaderReplica), got.RequestID, got.Replica.ID)
		}
		if _, ok := h.store.Lease(got.RequestID); !ok {
			t.Error("decision booked no lease")
		}
	})

	t.Run("explain", func(t *testing.T) {
		status, _, raw := h.post(t, "/v1/route", `{"model":"m","token_ids":[1,2,3],"explain":true,"policy":"least-load","max_tokens":0}`)
		if status != http.StatusOK {
			t.Fatalf("status = %d; body %s", status, raw)
		}
		got := decodeJSON[api.RouteResponse](t, raw)
		if len(got.Candidates) != 2 || got.Policy != "least-load" {
			t.Errorf("got %d candidates, policy %q; want 2, least-load", len(got.Candidates), got.Policy)
		}
		if !strings.Contains(raw, `"adjusted_prefill"`) {
			t.Errorf("explain lacks the score parts: %s", raw)
		}
	})

	t.Run("repeat after release goes to the same replica", func(t *testing.T) {
		body := `{"model":"m","token_ids":` + tokenJSON(1000, 80) + `}`
		_, _, raw := h.post(t, "/v1/route", body)
		first := decodeJSON[api.RouteResponse](t, raw)
		if status, _, raw := h.post(t, "/v1/requests/"+first.RequestID+"/release", ""); status != http.StatusOK {
			t.Fatalf("release: %d %s", status, raw)
		}
		_, _, raw = h.post(t, "/v1/route", body)
		second := decodeJSON[api.RouteResponse](t, raw)
		if second.Replica.ID != first.Replica.ID {
			t.Errorf("repeat went to %s, first to %s", second.Replica.ID, first.Replica.ID)
		}
		if !second.Approximate || second.MatchedBlocks != 5 {
			t.Errorf("repeat matched %d approximate=%v, want 5 true", second.MatchedBlocks, second.Approximate)
		}
	})
}

func TestRouteSession(t *testing.T) {
	h := newHarness(t, fleet(3, "m"))
	pick := func(t *testing.T, body string, header ...string) string {
		t.Helper()
		status, _, raw := h.post(t, "/v1/route", body, header...)
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, raw)
		}
		return decodeJSON[api.RouteResponse](t, raw).Replica.ID
	}
	bySession := map[string]string{}
	var a, b string
	for i := 0; i < 50 && b == ""; i++ {
		s := fmt.Sprintf("sess-%d", i)
		bySession[s] = pick(t, `{"model":"m","token_ids":[],"policy":"session","session_id":"`+s+`"}`)
		if a == "" {
			a = s
		} else if bySession[s] != bySession[a] {
			b = s
		}
	}
	if b == "" {
		t.Fatal("50 sessions all landed on one replica")
	}
	t.Run("header", func(t *testing.T) {
		for range 3 {
			if got := pick(t, `{"model":"m","token_ids":[],"policy":"session"}`, "X-Session-Id", b); got != bySession[b] {
				t.Errorf("header session %s went to %s, want %s", b, got, bySession[b])
			}
		}
	})
	t.Run("body wins over header", func(t *testing.T) {
		got := pick(t, `{"model":"m","token_ids":[],"policy":"session","session_id":"`+a+`"}`, "X-Session-Id", b)
		if got != bySession[a] {
			t.Errorf("went to %s, want body session's %s", got, bySession[a])
		}
	})
}

func TestRouteErrors(t *testing.T) {
	replicas := append(fleet(2, "m"), kvroute.Replica{ID: "sick", Model: "down", URL: "http://sick:8000", Health: kvroute.HealthUnhealthy})
	h := newHarness(t, replicas, func(c *api.Config) {
		c.MaxTokens = 100
		c.MaxBodyBytes = 4096
	})
	tests := []struct {
		name        string
		contentType string
		body        string
		wantStatus  int
		wantCode    string
		wantField   string
		wantMsg     string
	}{
		{"unknown field", "application/json", `{"model":"m","token_ids":[1],"bogus":1}`, 400, "invalid_input", "bogus", "not a known field"},
		{"negative token id", "application/json", `{"model":"m","token_ids":[1,2,-1]}`, 400, "invalid_input", "token_ids", "element 2"},
		{"token id too big", "application/json", `{"model":"m","token_ids":[4294967296]}`, 400, "invalid_input", "token_ids", "element 0"},
		{"largest token id", "application/json", `{"model":"nope","token_ids":[4294967295]}`, 404, "model_not_found", "", ""},
		{"fractional token id", "application/json", `{"model":"m","token_ids":[1.5]}`, 400, "invalid_input", "token_ids", "element 0"},
		{"string token id", "application/json", `{"model":"m","token_ids":[1, "a b"]}`, 400, "invalid_input", "token_ids", "element 1"},
		{"token ids not an array", "application/json", `{"model":"m","token_ids":"abc"}`, 400, "invalid_input", "token_ids", "array"},
		{"too many tokens", "application/json", `{"model":"m","token_ids":` + tokenJSON(0, 101) + `}`, 400, "invalid_input", "token_ids", "limit of 100"},
		{"model missing", "application/json", `{"token_ids":[1]}`, 400, "invalid_input", "model", "required"},
		{"model wrong type", "application/json", `{"model":5,"token_ids":[1]}`, 400, "invalid_input", "model", "string"},
		{"no prompt at all", "application/json", `{"model":"m"}`, 400, "invalid_input", "token_ids", "token_ids, prompt (text) or messages"},
		{"prompt and token ids", "application/json", `{"model":"m","prompt":"hello","token_ids":[1]}`, 400, "invalid_input", "token_ids", "exactly one of"},
		{"prompt and messages", "application/json", `{"model":"m","prompt":"hello","messages":[{"role":"user","content":"hi"}]}`, 400, "invalid_input", "token_ids", "exactly one of"},
		{"prompt not a string", "application/json", `{"model":"m","prompt":[1,2]}`, 400, "invalid_input", "prompt", "string"},
		{"messages not an array", "application/json", `{"model":"m","messages":{"role":"user"}}`, 400, "invalid_input", "messages", "array"},
		{"tools not an array", "application/json", `{"model":"m","messages":[],"tools":{}}`, 400, "invalid_input", "tools", "array"},
		{"kwargs not an object", "application/json", `{"model":"m","messages":[],"chat_template_kwargs":[1]}`, 400, "invalid_input", "chat_template_kwargs", "object"},
		{"negative max_tokens", "application/json", `{"model":"m","token_ids":[1],"max_tokens":-1}`, 400, "invalid_input", "max_tokens", ">= 0"},
		{"unknown policy", "application/json", `{"model":"m","token_ids":[1],"policy":"fastest"}`, 400, "invalid_input", "policy", "unknown policy"},
		{"malformed JSON", "application/json", `{"model":"m",`, 400, "invalid_json", "", "malformed"},
		{"syntax error", "application/json", `{"model" "m"}`, 400, "invalid_json", "", "malformed"},
		{"empty body", "application/json", ``, 400, "invalid_json", "", "empty"},
		{"not an object", "application/json", `[1,2]`, 400, "invalid_json", "", "object"},
		{"trailing data", "application/json", `{"model":"m","token_ids":[1]} {}`, 400, "invalid_input", "", "after the JSON"},
		{"wrong content type", "text/plain", `{"model":"m","token_ids":[1]}`, 400, "invalid_input", "", "Content-Type"},
		{"body too large", "application/json", `{"model":"m","session_id":"` + strings.Repeat("x", 5000) + `"}`, 413, "body_too_large", "", "larger"},
		{"unknown model", "application/json", `{"model":"other","token_ids":[1]}`, 404, "model_not_found", "", "other"},
		{"no healthy replica", "application/json", `{"model":"down","token_ids":[1]}`, 503, "no_replica", "", "unhealthy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, hdr, raw := h.do(t, http.MethodPost, "/v1/route", tt.contentType, tt.body)
			if status != tt.wantStatus {
				t.Fatalf("status = %d, want %d; body %s", status, tt.wantStatus, raw)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type = %q, want application/json", ct)
			}
			got := decodeJSON[api.ErrorBody](t, raw).Error
			if got.Code != tt.wantCode || got.Field != tt.wantField || !strings.Contains(got.Message, tt.wantMsg) {
				t.Errorf("error = %+v, want code %q field %q message containing %q", got, tt.wantCode, tt.wantField, tt.wantMsg)
			}
		})
	}
}

func TestRouteStoreDown(t *testing.T) {
	h := newHarness(t, fleet(2, "m"))
	body := `{"model":"m","token_ids":[1,2,3]}`
	if status, _, raw := h.post(t, "/v1/route", body); status != http.StatusOK {
		t.Fatalf("warm-up: %d %s", status, raw)
	}
	h.store.SetDown(true)

	t.Run("known replicas: degraded decision, not 5xx", func(t *testing.T) {
		status, hdr, raw := h.post(t, "/v1/route", body)
		if status != http.StatusOK {
			t.Fatalf("status = %d, want 200; body %s", status, raw)
		}
		got := decodeJSON[api.RouteResponse](t, raw)
		if !got.Degraded || got.Reason == "" {
			t.Errorf("degraded=%v reason=%q, want true and a reason", got.Degraded, got.Reason)
		}
		if r := hdr.Get(api.HeaderDegradedReason); r != api.ReasonStoreUnavailable {
			t.Errorf("%s = %q, want %q", api.HeaderDegradedReason, r, api.ReasonStoreUnavailable)
		}
	})

	t.Run("no replica ever known: 503", func(t *testing.T) {
		cold := newHarness(t, fleet(2, "m"))
		cold.store.SetDown(true)
		status, hdr, raw := cold.post(t, "/v1/route", body)
		if status != http.StatusServiceUnavailable {
			t.Fatalf("status = %d, want 503; body %s", status, raw)
		}
		if hdr.Get("Retry-After") == "" {
			t.Error("503 without Retry-After")
		}
		if got := decodeJSON[api.ErrorBody](t, raw).Error.Code; got != "unavailable" {
			t.Errorf("code = %q, want unavailable", got)
		}
	})
}

// TestRouteRedirect: /v1/route no longer redirects. Its 307 re-posted the
// decision body to the replica, which rejects it (no prompt, no stream):
// the redirect moved to the OpenAI endpoints (TestOpenAIRedirect), and
// ?redirect=true here is a 400 pointing there. Query booleans are strict.
func TestRouteRedirect(t *testing.T) {
	h := newHarness(t, fleet(1, "m"))
	tests := []struct {
		name, query string
		wantStatus  int
		wantField   string
	}{
		{"redirect refused", "?redirect=true", 400, "redirect"},
		{"path refused", "?path=/v1/chat/completions", 400, "path"},
		{"redirect false", "?redirect=false", 200, ""},
		{"not a boolean", "?redirect=yes", 400, "redirect"},
		{"empty", "?redirect=", 400, "redirect"},
		{"twice", "?redirect=false&redirect=true", 400, "redirect"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, _, raw := h.post(t, "/v1/route"+tt.query, `{"model":"m","token_ids":[1]}`)
			if status != tt.wantStatus {
				t.Fatalf("status = %d, want %d; body %s", status, tt.wantStatus, raw)
			}
			if tt.wantField != "" {
				if got := decodeJSON[api.ErrorBody](t, raw).Error.Field; got != tt.wantField {
					t.Errorf("field = %q, want %q; body %s", got, tt.wantField, raw)
				}
			}
		})
	}
	if calls := h.store.Calls(); len(calls) != 0 {
		t.Errorf("refused requests reached the store: %v", calls)
	}
}

func TestProgress(t *testing.T) {
	h := newHarness(t, fleet(1, "m"))
	_, _, raw := h.post(t, "/v1/route", `{"model":"m","token_ids":`+tokenJSON(0, 32)+`}`)
	id := decodeJSON[api.RouteResponse](t, raw).RequestID
	steps := []struct {
		path      string
		wantFound bool
	}{
		{"/v1/requests/" + id + "/first-token", true},
		{"/v1/requests/" + id + "/first-token", true},
		{"/v1/requests/" + id + "/release", true},
		{"/v1/requests/" + id + "/release", false},
		{"/v1/requests/" + id + "/first-token", false},
		{"/v1/requests/unknown/release", false},
	}
	for i, st := range steps {
		status, _, raw := h.post(t, st.path, "")
		if status != http.StatusOK {
			t.Fatalf("step %d %s: status %d, want 200; body %s", i, st.path, status, raw)
		}
		got := decodeJSON[api.ProgressResponse](t, raw)
		if got.Found != st.wantFound || got.RequestID == "" {
			t.Errorf("step %d %s: got %+v, want found=%v", i, st.path, got, st.wantFound)
		}
	}
	if l := h.store.Load("r0"); l.PrefillBlocks != 0 || l.DecodeBlocks != 0 || l.Requests != 0 {
		t.Errorf("load after release = %+v, want zero", l)
	}
}

func TestReplicas(t *testing.T) {
	h := newHarness(t, nil)
	put := func(t *testing.T, id, body string) (int, string) {
		t.Helper()
		status, _, raw := h.do(t, http.MethodPut, "/v1/replicas/"+id, "application/json", body)
		return status, raw
	}

	t.Run("route before registration", func(t *testing.T) {
		if status, _, raw := h.post(t, "/v1/route", `{"model":"m","token_ids":[1]}`); status != http.StatusNotFound {
			t.Fatalf("status %d, want 404; %s", status, raw)
		}
	})
	t.Run("create", func(t *testing.T) {
		status, raw := put(t, "b", `{"model":"m","url":"http://b:8000"}`)
		if status != http.StatusCreated {
			t.Fatalf("status %d, want 201; %s", status, raw)
		}
		if got := decodeJSON[kvroute.Replica](t, raw); got.ID != "b" || got.URL != "http://b:8000" {
			t.Errorf("stored %+v", got)
		}
	})
	t.Run("route sees the write at once", func(t *testing.T) {
		status, _, raw := h.post(t, "/v1/route", `{"model":"m","token_ids":`+tokenJSON(0, 16)+`}`)
		if status != http.StatusOK {
			t.Fatalf("status %d, want 200 after PUT invalidated the router's cache; %s", status, raw)
		}
	})
	t.Run("replace", func(t *testing.T) {
		if status, raw := put(t, "b", `{"id":"b","model":"m","url":"http://b2:8000"}`); status != http.StatusOK {
			t.Fatalf("status %d, want 200; %s", status, raw)
		}
		if status, raw := put(t, "a", `{"id":"a","model":"m","url":"http://a:8000","labels":{"zone":"x"}}`); status != http.StatusCreated {
			t.Fatalf("status %d, want 201; %s", status, raw)
		}
	})
	for _, tt := range []struct{ name, id, body, field string }{
		{"id mismatch", "a", `{"id":"b","model":"m","url":"http://a"}`, "id"},
		{"invalid id", "a%20b", `{"model":"m","url":"http://a"}`, "id"},
		{"missing url", "c", `{"model":"m"}`, "url"},
		{"unknown field", "c", `{"model":"m","url":"http://c","weight":2}`, "weight"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, raw := put(t, tt.id, tt.body)
			if status != http.StatusBadRequest || decodeJSON[api.ErrorBody](t, raw).Error.Field != tt.field {
				t.Errorf("got %d %s, want 400 naming %s", status, raw, tt.field)
			}
		})
	}
	t.Run("list", func(t *testing.T) {
		status, _, raw := h.do(t, http.MethodGet, "/v1/replicas", "", "")
		if status != http.StatusOK {
			t.Fatalf("status %d; %s", status, raw)
		}
		got := decodeJSON[api.ReplicaList](t, raw)
		if len(got.Replicas) != 2 || got.Replicas[0].ID != "a" || got.Replicas[1].ID != "b" || got.Replicas[1].URL != "http://b2:8000" {
			t.Errorf("list = %+v, want a, b (replaced)", got.Replicas)
		}
		for _, r := range got.Replicas {
			if r.Source != "registered" || r.State != "serving" {
				t.Errorf("%s: source %q state %q, want registered, serving (said explicitly)", r.ID, r.Source, r.State)
			}
		}
	})
	t.Run("get", func(t *testing.T) {
		status, _, raw := h.do(t, http.MethodGet, "/v1/replicas/b", "", "")
		if status != http.StatusOK {
			t.Fatalf("status %d; %s", status, raw)
		}
		got := decodeJSON[api.ReplicaDetail](t, raw)
		if got.ID != "b" || !got.Routable || got.Load == nil || got.AppliedSeq != nil {
			t.Errorf("detail = %s", raw)
		}
		if got.Blocks != 1 || got.Load.Requests != 1 {
			t.Errorf("blocks=%d requests=%d, want 1 1 (the decision above)", got.Blocks, got.Load.Requests)
		}
	})
	t.Run("get missing", func(t *testing.T) {
		status, _, raw := h.do(t, http.MethodGet, "/v1/replicas/zzz", "", "")
		if status != http.StatusNotFound || decodeJSON[api.ErrorBody](t, raw).Error.Code != "replica_not_found" {
			t.Errorf("got %d %s, want 404 replica_not_found", status, raw)
		}
	})
	t.Run("delete", func(t *testing.T) {
		if status, _, raw := h.do(t, http.MethodDelete, "/v1/replicas/a", "", ""); status != http.StatusNoContent {
			t.Fatalf("status %d, want 204; %s", status, raw)
		}
		if status, _, _ := h.do(t, http.MethodDelete, "/v1/replicas/a", "", ""); status != http.StatusNotFound {
			t.Errorf("second delete: status %d, want 404", status)
		}
		if status, _, _ := h.do(t, http.MethodGet, "/v1/replicas/a", "", ""); status != http.StatusNotFound {
			t.Errorf("get after delete: status %d, want 404", status)
		}
	})
}

func TestHealth(t *testing.T) {
	var ready error
	h := newHarness(t, fleet(1, "m"), func(c *api.Config) {
		c.Ready = func(context.Context) error { return ready }
	})
	tests := []struct {
		name       string
		path       string
		ready      error
		wantStatus int
	}{
		{"healthz", "/healthz", nil, 200},
		{"healthz ignores the store", "/healthz", errors.New("redis down"), 200},
		{"readyz", "/readyz", nil, 200},
		{"readyz not ready", "/readyz", errors.New("redis down"), 503},
		{"unknown path", "/nope", nil, 404},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ready = tt.ready
			status, _, raw := h.do(t, http.MethodGet, tt.path, "", "")
			if status != tt.wantStatus {
				t.Errorf("status = %d, want %d; %s", status, tt.wantStatus, raw)
			}
			if tt.ready != nil && status == 503 && !strings.Contains(raw, "redis down") {
				t.Errorf("body %s does not say why", raw)
			}
		})
	}
	t.Run("method not allowed", func(t *testing.T) {
		status, _, raw := h.do(t, http.MethodGet, "/v1/route", "", "")
		if status != http.StatusMethodNotAllowed || decodeJSON[api.ErrorBody](t, raw).Error.Code != "method_not_allowed" {
			t.Errorf("got %d %s", status, raw)
		}
	})
}

func TestMetrics(t *testing.T) {
	h := newHarness(t, fleet(1, "m"))
	h.post(t, "/v1/route", `{"model":"m","token_ids":`+tokenJSON(0, 32)+`}`)
	h.post(t, "/v1/route", `{"model":"x","token_ids":[1]}`)
	status, _, raw := h.do(t, http.MethodGet, "/metrics", "", "")
	if status != http.StatusOK {
		t.Fatalf("status %d", status)
	}
	for _, want := range []string{
		`kvroute_decisions_total{degraded="false",policy="kv"} 1`,
		`kvroute_api_errors_total{code="model_not_found"} 1`,
		`kvroute_decision_duration_seconds_count 1`,
		`kvroute_matched_block_ratio_count 1`,
	} {
		if !strings.Contains(raw, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}
