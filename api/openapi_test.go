package api_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/router"
)

// spec is openapi.yaml, loaded and validated once per test.
type spec struct {
	doc    *openapi3.T
	router routers.Router
}

func loadSpec(tb testing.TB) *spec {
	tb.Helper()
	loader := openapi3.NewLoader()
	doc, err := loader.LoadFromFile(filepath.Join("..", "openapi.yaml"))
	if err != nil {
		tb.Fatalf("load openapi.yaml: %v", err)
	}
	if err := doc.Validate(context.Background(), openapi3.AllowExtraSiblingFields("description")); err != nil {
		tb.Fatalf("openapi.yaml is not valid OpenAPI: %v", err)
	}
	r, err := gorillamux.NewRouter(doc)
	if err != nil {
		tb.Fatal(err)
	}
	return &spec{doc: doc, router: r}
}

func init() {
	openapi3filter.RegisterBodyDecoder("text/event-stream", func(r io.Reader, _ http.Header, _ *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
		b, err := io.ReadAll(r)
		return string(b), err
	})
}

// check sends a request to h and validates the real answer against the
// spec: its status must be documented, and its headers and body must
// match what is documented for it.
func (sp *spec) check(t *testing.T, h *harness, method, path, body string, header ...string) (int, http.Header, string) {
	t.Helper()
	status, hdr, raw := h.do(t, method, path, "application/json", body, header...)
	req, err := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	route, params, err := sp.router.FindRoute(req)
	if err != nil {
		if status == http.StatusNotFound || status == http.StatusMethodNotAllowed {
			// Not an endpoint of the spec: the answer is the error shape.
			if !strings.Contains(raw, `"error"`) {
				t.Errorf("%s %s: %d %s, want a JSON error", method, path, status, raw)
			}
			return status, hdr, raw
		}
		t.Fatalf("%s %s is not in openapi.yaml: %v", method, path, err)
	}
	in := &openapi3filter.ResponseValidationInput{
		RequestValidationInput: &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
			Options: &openapi3filter.Options{AuthenticationFunc: openapi3filter.NoopAuthenticationFunc}},
		Status: status, Header: hdr, Body: io.NopCloser(bytes.NewReader([]byte(raw))),
		Options: &openapi3filter.Options{IncludeResponseStatus: true, MultiError: true},
	}
	if err := openapi3filter.ValidateResponse(context.Background(), in); err != nil {
		t.Errorf("%s %s answered %d %s\nwhich openapi.yaml does not describe: %v", method, path, status, raw, err)
	}
	if status == http.StatusTemporaryRedirect && hdr.Get("Location") == "" {
		t.Errorf("%s %s: 307 without Location", method, path)
	}
	return status, hdr, raw
}

// TestOpenAPI runs every endpoint and every error class against a real
// server and validates each answer against openapi.yaml, so that the two
// cannot drift.
func TestOpenAPI(t *testing.T) {
	sp := loadSpec(t)
	up := newUpstream(t, http.StatusOK)
	close(up.next) // streams finish at once
	reps := []kvroute.Replica{up.replica("r0"), {ID: "sick", Model: "down", URL: "http://sick:8000", Health: kvroute.HealthUnhealthy}}
	h := newHarness(t, reps, func(c *api.Config) { c.MaxTokens = 100; c.MaxBodyBytes = 4096 })
	dead := newHarness(t, []kvroute.Replica{{ID: "dead", Model: "m", URL: deadURL(t)}})
	locked := newHarness(t, fleet(1, "m"), withTokens([]string{adminToken}, []string{apiToken}, true))
	shed := newHarness(t, fleet(1, "m"), withAsked(&asked{err: &router.ShedError{Model: "m", Reason: kvroute.ShedQueueFull, RetryAfter: 2500 * time.Millisecond, Position: 3}}))
	cold := newHarness(t, fleet(1, "m"), withAsked(&asked{err: &router.ShedError{Model: "m", Reason: kvroute.ShedNoReplica, RetryAfter: time.Second}}))
	waited := newHarness(t, []kvroute.Replica{up.replica("r0")}, withAsked(&asked{queued: 40 * time.Millisecond}))

	route := `{"model":"m","token_ids":` + tokenJSON(0, 40) + `,"explain":true}`
	_, _, raw := h.do(t, http.MethodPost, "/v1/route", "application/json", route)
	id := decodeJSON[api.RouteResponse](t, raw).RequestID
	cases := []struct {
		name, method, path, body string
		want                     int
		h                        *harness
		header                   []string
	}{
		{"route", "POST", "/v1/route", route, 200, h, nil},
		{"route text", "POST", "/v1/route", `{"model":"m","prompt":"hello"}`, 200, h, nil},
		{"route chat", "POST", "/v1/route", `{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":true}`, 200, h, nil},
		{"route redirect false", "POST", "/v1/route?redirect=false", route, 200, h, nil},
		{"route bad field", "POST", "/v1/route", `{"model":"m","token_ids":[-1]}`, 400, h, nil},
		{"route no prompt", "POST", "/v1/route", `{"model":"m"}`, 400, h, nil},
		{"route case variant", "POST", "/v1/route", `{"MODEL":"m","token_ids":[1]}`, 400, h, nil},
		{"route malformed", "POST", "/v1/route", `{"model"`, 400, h, nil},
		{"route redirect", "POST", "/v1/route?redirect=true", route, 400, h, nil},
		{"route too large", "POST", "/v1/route", `{"model":"m","session_id":"` + strings.Repeat("x", 5000) + `"}`, 413, h, nil},
		{"route unknown model", "POST", "/v1/route", `{"model":"x","token_ids":[1]}`, 404, h, nil},
		{"route no healthy replica", "POST", "/v1/route", `{"model":"down","token_ids":[1]}`, 503, h, nil},
		{"route unauthorized", "POST", "/v1/route", route, 401, locked, nil},
		{"route with token", "POST", "/v1/route", `{"model":"m","token_ids":[1]}`, 200, locked, bearerHeader(apiToken)},
		{"route priority and wait", "POST", "/v1/route", `{"model":"m","token_ids":[1],"priority":-1,"max_wait_ms":500}`, 200, waited, nil},
		{"route bad priority", "POST", "/v1/route", `{"model":"m","token_ids":[1],"priority":0.5}`, 400, h, nil},
		{"route shed", "POST", "/v1/route", `{"model":"m","token_ids":[1]}`, 429, shed, nil},
		{"route cold start", "POST", "/v1/route", `{"model":"m","token_ids":[1]}`, 503, cold, nil},
		{"first token", "POST", "/v1/requests/" + id + "/first-token", "", 200, h, nil},
		{"release", "POST", "/v1/requests/" + id + "/release", "", 200, h, nil},
		{"release unauthorized", "POST", "/v1/requests/x/release", "", 401, locked, nil},
		{"completion", "POST", "/v1/completions", `{"model":"m","prompt":[1,2,3]}`, 200, h, nil},
		{"completion stream", "POST", "/v1/completions", `{"model":"m","prompt":[1,2,3],"stream":true}`, 200, h, nil},
		{"chat", "POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 200, h, nil},
		{"completion priority", "POST", "/v1/completions", `{"model":"m","prompt":[1],"priority":2}`, 200, waited, []string{api.HeaderMaxWaitMs, "100"}},
		{"chat priority header", "POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 200, waited, []string{api.HeaderPriority, "3"}},
		{"completion bad priority", "POST", "/v1/completions", `{"model":"m","prompt":[1],"priority":"high"}`, 400, h, nil},
		{"completion shed", "POST", "/v1/completions", `{"model":"m","prompt":[1]}`, 429, shed, nil},
		{"chat cold start", "POST", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 503, cold, nil},
		{"completion redirect", "POST", "/v1/completions?redirect=true", `{"model":"m","prompt":[1]}`, 307, h, nil},
		{"completion bad redirect", "POST", "/v1/completions?redirect=1", `{"model":"m","prompt":[1]}`, 400, h, nil},
		{"completion bad prompt", "POST", "/v1/completions", `{"model":"m","prompt":[1,-2]}`, 400, h, nil},
		{"completion max_tokens", "POST", "/v1/completions", `{"model":"m","prompt":[1],"max_tokens":1e12}`, 400, h, nil},
		{"chat without messages", "POST", "/v1/chat/completions", `{"model":"m"}`, 400, h, nil},
		{"completion too large", "POST", "/v1/completions", `{"model":"m","prompt":"` + strings.Repeat("x", 5000) + `"}`, 413, h, nil},
		{"completion unknown model", "POST", "/v1/completions", `{"model":"x","prompt":[1]}`, 404, h, nil},
		{"completion no healthy replica", "POST", "/v1/completions", `{"model":"down","prompt":[1]}`, 503, h, nil},
		{"completion dead replica", "POST", "/v1/completions", `{"model":"m","prompt":[1]}`, 502, dead, nil},
		{"chat unauthorized", "POST", "/v1/chat/completions", `{}`, 401, locked, nil},
		{"models", "GET", "/v1/models", "", 200, h, nil},
		{"models unauthorized", "GET", "/v1/models", "", 401, locked, nil},
		{"replicas", "GET", "/v1/replicas", "", 200, h, nil},
		{"replicas unauthorized", "GET", "/v1/replicas", "", 401, locked, nil},
		{"replica", "GET", "/v1/replicas/r0", "", 200, h, nil},
		{"replica missing", "GET", "/v1/replicas/zz", "", 404, h, nil},
		{"put create", "PUT", "/v1/replicas/n1", `{"model":"m2","url":"http://n1:8000","labels":{"zone":"a"}}`, 201, h, nil},
		{"put replace", "PUT", "/v1/replicas/n1", `{"model":"m2","url":"http://n1:8001"}`, 200, h, nil},
		{"put bad url", "PUT", "/v1/replicas/n2", `{"model":"m","url":"file:///etc/passwd"}`, 400, h, nil},
		{"put metadata", "PUT", "/v1/replicas/n2", `{"model":"m","url":"http://169.254.169.254/"}`, 400, h, nil},
		{"put too large", "PUT", "/v1/replicas/n2", `{"model":"m","url":"http://n2","topic":"` + strings.Repeat("x", 5000) + `"}`, 413, h, nil},
		{"put unauthorized", "PUT", "/v1/replicas/n2", `{"model":"m","url":"http://n2"}`, 401, locked, nil},
		{"delete", "DELETE", "/v1/replicas/n1", "", 204, h, nil},
		{"delete missing", "DELETE", "/v1/replicas/n1", "", 404, h, nil},
		{"delete unauthorized", "DELETE", "/v1/replicas/r0", "", 401, locked, nil},
		{"healthz", "GET", "/healthz", "", 200, h, nil},
		{"readyz", "GET", "/readyz", "", 200, h, nil},
		{"metrics", "GET", "/metrics", "", 200, h, nil},
		{"metrics unauthorized", "GET", "/metrics", "", 401, locked, nil},
		{"metrics with the admin token", "GET", "/metrics", "", 200, locked, bearerHeader(adminToken)},
		{"unknown path", "GET", "/nope", "", 404, h, nil},
		{"wrong method", "GET", "/v1/route", "", 405, h, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, _, raw := sp.check(t, tc.h, tc.method, tc.path, tc.body, tc.header...)
			if status != tc.want {
				t.Errorf("status %d, want %d; body %s", status, tc.want, raw)
			}
		})
	}
	t.Run("store down: degraded decision", func(t *testing.T) {
		h.store.SetDown(true)
		defer h.store.SetDown(false)
		status, hdr, raw := sp.check(t, h, "POST", "/v1/route", `{"model":"m","token_ids":[1,2]}`)
		if status != 200 || hdr.Get(api.HeaderDegradedReason) == "" {
			t.Errorf("got %d %s", status, raw)
		}
		if status, _, raw := sp.check(t, h, "GET", "/v1/replicas", ""); status != 503 {
			t.Errorf("registry with the store down: %d %s", status, raw)
		}
	})
}
