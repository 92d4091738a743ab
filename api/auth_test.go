package api_test

import (
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/router"
)

const (
	adminToken = "admin-token-0123456789"
	apiToken   = "api-token-0123456789ab"
)

func withTokens(admin, client []string, metricsAuth bool) option {
	return func(c *api.Config) {
		c.AdminTokens, c.APITokens, c.MetricsAuth = admin, client, metricsAuth
	}
}

func bearerHeader(tok string) []string { return []string{"Authorization", "Bearer " + tok} }

// checkUnauthorized asserts a 401 with the challenge and a JSON error.
func checkUnauthorized(tb testing.TB, status int, hdr http.Header, raw string) {
	tb.Helper()
	if status != http.StatusUnauthorized {
		tb.Fatalf("status = %d, want 401; body %s", status, raw)
	}
	if got := hdr.Get("WWW-Authenticate"); got != `Bearer realm="kvroute"` {
		tb.Errorf("WWW-Authenticate = %q", got)
	}
	if !strings.Contains(raw, `"unauthorized"`) || hdr.Get("Content-Type") != "application/json" {
		tb.Errorf("body %s (%s), want the JSON error with code unauthorized", raw, hdr.Get("Content-Type"))
	}
}

// TestAdminAuth is the finding: with no credentials, DELETE answered 204,
// a PUT redirected a replica's traffic and another took it out of routing.
func TestAdminAuth(t *testing.T) {
	h := newHarness(t, fleet(2, "m"), withTokens([]string{adminToken}, nil, false))
	before := h.registry(t)
	attacks := []struct{ name, method, path, body string }{
		{"delete", http.MethodDelete, "/v1/replicas/r0", ""},
		{"redirect traffic", http.MethodPut, "/v1/replicas/r0", `{"model":"m","url":"http://attacker.example:80"}`},
		{"take out of routing", http.MethodPut, "/v1/replicas/r1", `{"model":"m","url":"http://replica-1:8000","health":"unhealthy"}`},
		{"replica internals", http.MethodGet, "/v1/replicas/r0", ""},
		{"list", http.MethodGet, "/v1/replicas", ""},
	}
	for _, a := range attacks {
		for _, cred := range []struct{ name, header string }{
			{"no token", ""}, {"wrong token", "Bearer not-the-admin-token-xx"}, {"basic", "Basic YWRtaW46YWRtaW4="},
			{"empty bearer", "Bearer "}, {"api-like token", "Bearer " + apiToken},
		} {
			t.Run(a.name+"/"+cred.name, func(t *testing.T) {
				var hdr []string
				if cred.header != "" {
					hdr = []string{"Authorization", cred.header}
				}
				status, rh, raw := h.do(t, a.method, a.path, "application/json", a.body, hdr...)
				checkUnauthorized(t, status, rh, raw)
				if strings.Contains(raw, adminToken) {
					t.Error("the answer quotes the token")
				}
			})
		}
	}
	if after := h.registry(t); after != before {
		t.Errorf("registry changed without credentials:\n%s\nthen\n%s", before, after)
	}
	t.Run("admin token opens it", func(t *testing.T) {
		status, _, raw := h.do(t, http.MethodPut, "/v1/replicas/r2", "application/json", `{"model":"m","url":"http://replica-2:8000"}`, bearerHeader(adminToken)...)
		if status != http.StatusCreated {
			t.Fatalf("status %d, want 201; %s", status, raw)
		}
		if status, _, raw := h.do(t, http.MethodDelete, "/v1/replicas/r2", "", "", "Authorization", "bearer "+adminToken); status != http.StatusNoContent {
			t.Fatalf("delete (scheme in lower case): %d %s", status, raw)
		}
	})
	t.Run("decisions stay open without API tokens", func(t *testing.T) {
		if status, _, raw := h.post(t, "/v1/route", `{"model":"m","token_ids":[1]}`); status != http.StatusOK {
			t.Errorf("status %d: %s", status, raw)
		}
	})
	t.Run("probes and metrics stay open", func(t *testing.T) {
		for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
			if status, _, raw := h.do(t, http.MethodGet, p, "", ""); status != http.StatusOK {
				t.Errorf("%s: %d %s", p, status, raw)
			}
		}
	})
}

func TestAPIAuth(t *testing.T) {
	up := newUpstream(t, http.StatusOK)
	h := newHarness(t, []kvroute.Replica{up.replica("r0")}, withTokens([]string{adminToken}, []string{apiToken}, true))
	endpoints := []struct{ name, method, path, body string }{
		{"route", http.MethodPost, "/v1/route", `{"model":"m","token_ids":[1]}`},
		{"release", http.MethodPost, "/v1/requests/x/release", ""},
		{"first token", http.MethodPost, "/v1/requests/x/first-token", ""},
		{"models", http.MethodGet, "/v1/models", ""},
		{"completions", http.MethodPost, "/v1/completions", `{"model":"m","prompt":[1,2]}`},
		{"chat", http.MethodPost, "/v1/chat/completions", `{"model":"m","token_ids":[1,2],"messages":[]}`},
	}
	for _, e := range endpoints {
		t.Run(e.name+"/no token", func(t *testing.T) {
			status, hdr, raw := h.do(t, e.method, e.path, "application/json", e.body)
			checkUnauthorized(t, status, hdr, raw)
		})
		for _, tok := range []string{apiToken, adminToken} {
			t.Run(e.name+"/token", func(t *testing.T) {
				status, _, raw := h.do(t, e.method, e.path, "application/json", e.body, bearerHeader(tok)...)
				if status != http.StatusOK {
					t.Errorf("status %d: %s", status, raw)
				}
			})
		}
	}
	for range 2 {
		up.received(t)
		up.received(t)
	}
	t.Run("kvroute's token is not forwarded to the replica", func(t *testing.T) {
		status, _, raw := h.post(t, "/v1/completions", `{"model":"m","prompt":[1,2]}`, bearerHeader(apiToken)...)
		if status != http.StatusOK {
			t.Fatalf("status %d: %s", status, raw)
		}
		if got := up.received(t).header.Get("Authorization"); got != "" {
			t.Errorf("replica got Authorization %q", got)
		}
	})
	t.Run("an API token does not open the admin API", func(t *testing.T) {
		status, hdr, raw := h.do(t, http.MethodDelete, "/v1/replicas/r0", "", "", bearerHeader(apiToken)...)
		checkUnauthorized(t, status, hdr, raw)
	})
	t.Run("metrics behind the admin token", func(t *testing.T) {
		status, hdr, raw := h.do(t, http.MethodGet, "/metrics", "", "", bearerHeader(apiToken)...)
		checkUnauthorized(t, status, hdr, raw)
		if status, _, _ := h.do(t, http.MethodGet, "/metrics", "", "", bearerHeader(adminToken)...); status != http.StatusOK {
			t.Errorf("metrics with the admin token: %d", status)
		}
	})
	t.Run("OpenAI endpoints answer 401 in OpenAI's shape", func(t *testing.T) {
		_, _, raw := h.post(t, "/v1/chat/completions", `{}`)
		if got := decodeJSON[api.OpenAIErrorBody](t, raw).Error; got.Type != "authentication_error" || got.Code != "unauthorized" {
			t.Errorf("error %+v", got)
		}
	})
}

func TestAccessConfig(t *testing.T) {
	mem := mock.NewMemory()
	rt, err := router.New(mem.Index(), mem.Registry(), router.DefaultConfig(), router.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name   string
		access api.Access
	}{
		{"short admin token", api.Access{AdminTokens: []string{"short"}}},
		{"empty API token", api.Access{APITokens: []string{""}}},
		{"padded token", api.Access{AdminTokens: []string{" " + adminToken}}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := api.New(api.Config{Router: rt, Registry: mem.Registry(), Logger: slog.New(slog.DiscardHandler), Access: tt.access})
			if err == nil {
				t.Fatal("New accepted it")
			}
			if strings.Contains(err.Error(), adminToken) {
				t.Errorf("the error quotes the token: %v", err)
			}
		})
	}
}
