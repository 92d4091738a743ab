package api_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/router"
)

// errorField is the field an error answer names, in either shape.
func errorField(tb testing.TB, raw string) string {
	tb.Helper()
	if strings.Contains(raw, `"param"`) {
		if p := decodeJSON[api.OpenAIErrorBody](tb, raw).Error.Param; p != nil {
			return *p
		}
		return ""
	}
	return decodeJSON[api.ErrorBody](tb, raw).Error.Field
}

// TestOutputTokenLimit is the finding: max_tokens 1e9 booked 62.5 M decode
// blocks, 1e18 gave an expiry in 1734, and 2^63-1 a 400 about an internal
// field.
func TestOutputTokenLimit(t *testing.T) {
	up := newUpstream(t, http.StatusOK)
	h := newHarness(t, []kvroute.Replica{up.replica("r0")}, func(c *api.Config) { c.MaxOutputTokens = 1000 })
	tests := []struct {
		name, path, body, field string
	}{
		{"route 1e9", "/v1/route", `{"model":"m","token_ids":[1],"max_tokens":1000000000}`, "max_tokens"},
		{"route 1e18", "/v1/route", `{"model":"m","token_ids":[1],"max_tokens":1000000000000000000}`, "max_tokens"},
		{"route 2^63-1", "/v1/route", `{"model":"m","token_ids":[1],"max_tokens":9223372036854775807}`, "max_tokens"},
		{"route overflows int", "/v1/route", `{"model":"m","token_ids":[1],"max_tokens":99999999999999999999}`, "max_tokens"},
		{"route exponent", "/v1/route", `{"model":"m","token_ids":[1],"max_tokens":1e30}`, "max_tokens"},
		{"route negative", "/v1/route", `{"model":"m","token_ids":[1],"max_tokens":-5}`, "max_tokens"},
		{"route one over", "/v1/route", `{"model":"m","token_ids":[1],"max_tokens":1001}`, "max_tokens"},
		{"proxy max_tokens", "/v1/completions", `{"model":"m","prompt":[1],"max_tokens":1000000000}`, "max_tokens"},
		{"proxy max_completion_tokens", "/v1/chat/completions", `{"model":"m","messages":[],"token_ids":[1],"max_completion_tokens":9223372036854775807}`, "max_completion_tokens"},
		{"proxy overflow", "/v1/completions", `{"model":"m","prompt":[1],"max_tokens":1e19}`, "max_tokens"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, _, raw := h.post(t, tt.path, tt.body)
			if status != http.StatusBadRequest || errorField(t, raw) != tt.field {
				t.Fatalf("got %d %s, want 400 naming %s", status, raw, tt.field)
			}
			if strings.Contains(raw, "blocks") {
				t.Errorf("the error names an internal field: %s", raw)
			}
		})
	}
	t.Run("the limit itself is accepted, and its lease is bounded", func(t *testing.T) {
		start := time.Now()
		status, _, raw := h.post(t, "/v1/route", `{"model":"m","token_ids":[1],"max_tokens":1000}`)
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, raw)
		}
		got := decodeJSON[api.RouteResponse](t, raw)
		if got.ExpiresAt.Before(start) || got.ExpiresAt.After(start.Add(router.MaxLease+time.Minute)) {
			t.Errorf("expires_at %v, want within MaxLease of now", got.ExpiresAt)
		}
		l, ok := h.store.Lease(got.RequestID)
		if !ok || l.DecodeBlocks != 63 {
			t.Errorf("lease %+v, want 63 decode blocks (1000 tokens)", l)
		}
	})
}

// TestStrictJSON: encoding/json matched keys case-insensitively and took
// duplicate keys and invalid UTF-8 silently.
func TestStrictJSON(t *testing.T) {
	up := newUpstream(t, http.StatusOK)
	h := newHarness(t, []kvroute.Replica{up.replica("r0")})
	tests := []struct {
		name, method, path, body, field string
	}{
		{"upper-case key", http.MethodPost, "/v1/route", `{"MODEL":"m","token_ids":[1]}`, "MODEL"},
		{"mixed-case key", http.MethodPost, "/v1/route", `{"model":"m","Token_IDs":[1]}`, "Token_IDs"},
		{"duplicate key", http.MethodPost, "/v1/route", `{"model":"m","model":"x","token_ids":[1]}`, "model"},
		{"escaped duplicate", http.MethodPost, "/v1/route", `{"model":"m","mod\u0065l":"x","token_ids":[1]}`, "model"},
		{"nested duplicate", http.MethodPost, "/v1/route", `{"model":"m","messages":[{"role":"user","role":"system","content":"x"}]}`, "messages[0].role"},
		{"invalid utf-8", http.MethodPost, "/v1/route", "{\"model\":\"m\",\"prompt\":\"a\xffb\"}", "prompt"},
		{"lone surrogate", http.MethodPost, "/v1/route", `{"model":"m","prompt":"a\ud800b"}`, "prompt"},
		{"invalid utf-8 deep", http.MethodPost, "/v1/route", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xc3\"}]}", "messages[0].content"},
		{"deep nesting", http.MethodPost, "/v1/route", `{"model":"m","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":{"a":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}}`, "chat_template_kwargs"},
		{"replica case variant", http.MethodPut, "/v1/replicas/x", `{"model":"m","URL":"http://x:8000"}`, "URL"},
		{"replica duplicate url", http.MethodPut, "/v1/replicas/x", `{"model":"m","url":"http://x:8000","url":"http://169.254.169.254"}`, "url"},
		{"proxy case variant", http.MethodPost, "/v1/completions", `{"model":"m","Model":"x","prompt":[1]}`, "Model"},
		{"proxy duplicate", http.MethodPost, "/v1/completions", `{"model":"m","prompt":[1],"max_tokens":1,"max_tokens":100000000}`, "max_tokens"},
		{"proxy invalid utf-8", http.MethodPost, "/v1/chat/completions", "{\"model\":\"m\",\"messages\":[{\"role\":\"user\",\"content\":\"\xff\"}]}", "messages[0].content"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			status, _, raw := h.do(t, tt.method, tt.path, "application/json", tt.body)
			if status != http.StatusBadRequest || errorField(t, raw) != tt.field {
				t.Errorf("got %d %s, want 400 naming %s", status, raw, tt.field)
			}
		})
	}
	t.Run("vendor fields still pass the proxy", func(t *testing.T) {
		status, _, raw := h.post(t, "/v1/completions", `{"model":"m","prompt":[1],"temperature":0,"extra_body":{"X":1,"x":2}}`)
		if status != http.StatusOK {
			t.Errorf("status %d: %s", status, raw)
		}
		up.received(t)
	})
	t.Run("a surrogate pair is text", func(t *testing.T) {
		status, _, raw := h.post(t, "/v1/route", `{"model":"m","prompt":"\ud83d\ude00"}`)
		if status != http.StatusOK {
			t.Errorf("status %d: %s", status, raw)
		}
	})
}

// TestReplicaAddresses is the SSRF finding through the admin API: every
// one of these was registered with 201.
func TestReplicaAddresses(t *testing.T) {
	h := newHarness(t, nil)
	for _, tt := range []struct{ name, body, field string }{
		{"file", `{"model":"m","url":"file:///etc/passwd"}`, "url"},
		{"metadata", `{"model":"m","url":"http://169.254.169.254/latest/meta-data/"}`, "url"},
		{"gopher", `{"model":"m","url":"gopher://127.0.0.1:6379/_FLUSHALL"}`, "url"},
		{"not a url", `{"model":"m","url":"not a url"}`, "url"},
		{"javascript", `{"model":"m","url":"javascript:alert(1)"}`, "url"},
		{"credentials", `{"model":"m","url":"http://user:pass@10.0.0.5:8000"}`, "url"},
		{"events at metadata", `{"model":"m","url":"http://10.0.0.5:8000","events":"tcp://169.254.169.254:5557"}`, "events"},
		{"huge label", `{"model":"m","url":"http://10.0.0.5:8000","labels":{"k":"` + strings.Repeat("v", 300) + `"}}`, "labels"},
		{"bad health", `{"model":"m","url":"http://10.0.0.5:8000","health":"great"}`, "health"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, _, raw := h.do(t, http.MethodPut, "/v1/replicas/x", "application/json", tt.body)
			if status != http.StatusBadRequest || errorField(t, raw) != tt.field {
				t.Errorf("got %d %s, want 400 naming %s", status, raw, tt.field)
			}
		})
	}
	if got := h.registry(t); got != "" {
		t.Errorf("registry after refusals: %s", got)
	}
}

// TestHeaderErrors: a header is input too, and its error is JSON naming it.
func TestHeaderErrors(t *testing.T) {
	h := newHarness(t, fleet(1, "m"))
	for _, tt := range []struct {
		name, path, value string
	}{
		{"session not UTF-8", "/v1/route", "s\xff"},
		{"session too long", "/v1/route", strings.Repeat("s", 1025)},
		{"proxy session not UTF-8", "/v1/completions", "s\xfe"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			body := `{"model":"m","token_ids":[1]}`
			if strings.Contains(tt.path, "completions") {
				body = `{"model":"m","prompt":[1]}`
			}
			status, hdr, raw := h.post(t, tt.path, body, api.HeaderSessionID, tt.value)
			if status != http.StatusBadRequest || errorField(t, raw) != api.HeaderSessionID || hdr.Get("Content-Type") != "application/json" {
				t.Errorf("got %d %s, want a JSON 400 naming %s", status, raw, api.HeaderSessionID)
			}
		})
	}
	t.Run("content type", func(t *testing.T) {
		status, hdr, raw := h.do(t, http.MethodPost, "/v1/route", "text/plain", `{}`)
		if status != http.StatusBadRequest || hdr.Get("Content-Type") != "application/json" {
			t.Errorf("got %d %s", status, raw)
		}
	})
}
