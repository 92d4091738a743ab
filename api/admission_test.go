package api_test

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/router"
)

// asked records what the API asked of the router, and answers as the
// router's queue would: after a wait, or with an error.
type asked struct {
	reqs   chan router.Request
	queued time.Duration
	err    error
}

// withAsked stands a in for the router's queue.
func withAsked(a *asked) option {
	a.reqs = make(chan router.Request, 16)
	return func(c *api.Config) {
		api.WithRoute(c, func(ctx context.Context, req router.Request, next api.RouteFunc) (router.Decision, error) {
			a.reqs <- req
			if a.err != nil {
				return router.Decision{}, a.err
			}
			d, err := next(ctx, req)
			d.Queued = a.queued
			return d, err
		})
	}
}

// last is the one request the router was asked since the previous call.
func (a *asked) last(tb testing.TB) router.Request {
	tb.Helper()
	select {
	case r := <-a.reqs:
		return r
	default:
		tb.Fatal("the router was asked nothing")
		return router.Request{}
	}
}

// TestAdmissionInputs: a request's priority, wait and tenant reach the
// router as the client gave them, and a bad one is a 400 naming it.
func TestAdmissionInputs(t *testing.T) {
	up := newUpstream(t, http.StatusOK)
	close(up.next)
	a := &asked{}
	h := newHarness(t, []kvroute.Replica{up.replica("r0")}, withAsked(a))
	route := func(extra string) string { return `{"model":"m","token_ids":[1,2,3]` + extra + `}` }
	completion := func(extra string) string { return `{"model":"m","prompt":[1,2,3]` + extra + `}` }
	for _, tt := range []struct {
		name, path, body string
		header           []string
		priority         int
		wait             time.Duration
	}{
		{"route defaults: no wait", "/v1/route", route(""), nil, 0, 0},
		{"route priority and wait", "/v1/route", route(`,"priority":-3,"max_wait_ms":1500`), nil, -3, 1500 * time.Millisecond},
		{"route zero wait", "/v1/route", route(`,"priority":7,"max_wait_ms":0`), nil, 7, 0},
		{"route ignores the proxy's headers", "/v1/route", route(""), []string{api.HeaderPriority, "5"}, 0, 0},
		{"proxy defaults: up to the TTL", "/v1/completions", completion(""), nil, 0, -1},
		{"proxy body priority", "/v1/completions", completion(`,"priority":4`), nil, 4, -1},
		{"proxy header priority", "/v1/completions", completion(""), []string{api.HeaderPriority, "-2"}, -2, -1},
		{"proxy body wins over header", "/v1/completions", completion(`,"priority":1`), []string{api.HeaderPriority, "9"}, 1, -1},
		{"proxy bounded wait", "/v1/completions", completion(""), []string{api.HeaderMaxWaitMs, "250"}, 0, 250 * time.Millisecond},
		{"proxy no wait", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}],"priority":2}`, []string{api.HeaderMaxWaitMs, "0"}, 2, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, _, raw := h.post(t, tt.path, tt.body, tt.header...)
			if status != http.StatusOK {
				t.Fatalf("status %d, want 200; body %s", status, raw)
			}
			got := a.last(t)
			if got.Priority != tt.priority || got.MaxWait != tt.wait || got.Tenant != "" {
				t.Errorf("got priority %d, wait %v, tenant %q; want %d, %v, anonymous", got.Priority, got.MaxWait, got.Tenant, tt.priority, tt.wait)
			}
		})
	}
	for _, tt := range []struct {
		name, path, body, field string
		header                  []string
	}{
		{"route fractional priority", "/v1/route", route(`,"priority":1.5`), "priority", nil},
		{"route string priority", "/v1/route", route(`,"priority":"high"`), "priority", nil},
		{"route priority out of range", "/v1/route", route(`,"priority":3000000000`), "priority", nil},
		{"route negative wait", "/v1/route", route(`,"max_wait_ms":-1`), "max_wait_ms", nil},
		{"route wait past a day", "/v1/route", route(`,"max_wait_ms":86400001`), "max_wait_ms", nil},
		{"proxy string priority", "/v1/completions", completion(`,"priority":"high"`), "priority", nil},
		{"proxy fractional priority", "/v1/completions", completion(`,"priority":1.5`), "priority", nil},
		{"proxy priority out of range", "/v1/completions", completion(`,"priority":-3000000000`), "priority", nil},
		{"proxy bad priority header", "/v1/completions", completion(""), api.HeaderPriority, []string{api.HeaderPriority, "urgent"}},
		{"proxy bad wait header", "/v1/completions", completion(""), api.HeaderMaxWaitMs, []string{api.HeaderMaxWaitMs, "-5"}},
		{"proxy non-integer wait header", "/v1/chat/completions", `{"model":"m","messages":[]}`, api.HeaderMaxWaitMs, []string{api.HeaderMaxWaitMs, "1s"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, _, raw := h.post(t, tt.path, tt.body, tt.header...)
			if status != http.StatusBadRequest {
				t.Fatalf("status %d, want 400; body %s", status, raw)
			}
			if got := errorField(t, raw); got != tt.field {
				t.Errorf("field = %q, want %q; body %s", got, tt.field, raw)
			}
			select {
			case r := <-a.reqs:
				t.Errorf("the router was asked %+v for a bad request", r)
			default:
			}
		})
	}
}

// TestTenant: the tenant is the matched token's name, or a trusted
// header's value, which wins; an untrusted header is nobody's tenant.
func TestTenant(t *testing.T) {
	const teamA, teamB = "token-of-team-a-0123", "token-of-team-b-0123"
	named := func(c *api.Config) {
		c.APITokens = []string{apiToken}
		c.AdminTokens = []string{adminToken}
		c.NamedAPITokens = []api.NamedToken{{Name: "team-a", Token: teamA}, {Name: "team.b", Token: teamB}}
	}
	a, trusted := &asked{}, &asked{}
	h := newHarness(t, fleet(1, "m"), named, withAsked(a))
	ht := newHarness(t, fleet(1, "m"), named, func(c *api.Config) { c.TenantHeader = "X-Tenant" }, withAsked(trusted))
	body := `{"model":"m","token_ids":[1,2,3]}`
	for _, tt := range []struct {
		name   string
		h      *harness
		a      *asked
		header []string
		want   string
	}{
		{"named token", h, a, bearerHeader(teamA), "team-a"},
		{"another named token", h, a, bearerHeader(teamB), "team.b"},
		{"bare token", h, a, bearerHeader(apiToken), ""},
		{"admin token", h, a, bearerHeader(adminToken), ""},
		{"untrusted header", h, a, append(bearerHeader(teamA), "X-Tenant", "mallory"), "team-a"},
		{"trusted header wins", ht, trusted, append(bearerHeader(teamA), "X-Tenant", "gateway-tenant"), "gateway-tenant"},
		{"trusted header absent", ht, trusted, bearerHeader(teamB), "team.b"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			status, _, raw := tt.h.post(t, "/v1/route", body, tt.header...)
			if status != http.StatusOK {
				t.Fatalf("status %d, want 200; body %s", status, raw)
			}
			if got := tt.a.last(t).Tenant; got != tt.want {
				t.Errorf("tenant = %q, want %q", got, tt.want)
			}
		})
	}
	t.Run("trusted header not a tenant name", func(t *testing.T) {
		status, _, raw := ht.post(t, "/v1/route", body, append(bearerHeader(teamA), "X-Tenant", "a b")...)
		if status != http.StatusBadRequest || errorField(t, raw) != "X-Tenant" {
			t.Errorf("got %d %s, want a 400 naming X-Tenant", status, raw)
		}
	})
	t.Run("names are checked", func(t *testing.T) {
		_, err := api.New(api.Config{Router: h.rt, Registry: h.store.Registry(),
			Access: api.Access{NamedAPITokens: []api.NamedToken{{Name: "a:b", Token: teamA}}}})
		if err == nil || strings.Contains(err.Error(), teamA) {
			t.Errorf("New = %v, want an error that does not quote the token", err)
		}
	})
}

// TestShed: a request admission refused is a 429 (a 503 when its model
// had no replica in time) with Retry-After, naming the reason and the
// position, in kvroute's shape on /v1/route and OpenAI's on the proxy.
func TestShed(t *testing.T) {
	full := &router.ShedError{Model: "m", Reason: kvroute.ShedQueueFull, RetryAfter: 1500 * time.Millisecond, Position: 7}
	cold := &router.ShedError{Model: "m", Reason: kvroute.ShedNoReplica, Position: 0}
	for _, tt := range []struct {
		name, path, body string
		err              *router.ShedError
		status           int
		retry            string
	}{
		{"route queue full", "/v1/route", `{"model":"m","token_ids":[1]}`, full, 429, "2"},
		{"route no replica", "/v1/route", `{"model":"m","token_ids":[1]}`, cold, 503, "1"},
		{"completion queue full", "/v1/completions", `{"model":"m","prompt":[1]}`, full, 429, "2"},
		{"chat no replica", "/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, cold, 503, "1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, fleet(1, "m"), withAsked(&asked{err: tt.err}))
			status, hdr, raw := h.post(t, tt.path, tt.body)
			if status != tt.status || hdr.Get("Retry-After") != tt.retry {
				t.Fatalf("got %d, Retry-After %q; want %d, %q; body %s", status, hdr.Get("Retry-After"), tt.status, tt.retry, raw)
			}
			if strings.Contains(raw, "router:") || strings.Contains(raw, "ShedError") {
				t.Errorf("the answer names internals: %s", raw)
			}
			if tt.path == "/v1/route" {
				d := decodeJSON[api.ErrorBody](t, raw).Error
				wantCode := map[int]string{429: api.CodeOverloaded, 503: api.CodeNoReplica}[tt.status]
				if d.Code != wantCode || d.Reason != tt.err.Reason || d.Position == nil || *d.Position != tt.err.Position {
					t.Errorf("error = %+v, want code %s, reason %s, position %d", d, wantCode, tt.err.Reason, tt.err.Position)
				}
				return
			}
			e := decodeJSON[api.OpenAIErrorBody](t, raw).Error
			wantType := map[int]string{429: "rate_limit_exceeded", 503: "service_unavailable"}[tt.status]
			if e.Type != wantType || e.Code != tt.err.Reason || e.Param != nil || e.Position == nil || *e.Position != tt.err.Position {
				t.Errorf("error = %+v, want type %s, code %s, position %d", e, wantType, tt.err.Reason, tt.err.Position)
			}
		})
	}
	t.Run("retry after rounds up", func(t *testing.T) {
		for _, tt := range []struct {
			after time.Duration
			want  string
		}{{0, "1"}, {time.Millisecond, "1"}, {time.Second, "1"}, {time.Second + time.Nanosecond, "2"}, {90 * time.Second, "90"}} {
			h := newHarness(t, fleet(1, "m"), withAsked(&asked{err: &router.ShedError{Model: "m", Reason: kvroute.ShedNoWait, RetryAfter: tt.after}}))
			if _, hdr, _ := h.post(t, "/v1/route", `{"model":"m","token_ids":[1]}`); hdr.Get("Retry-After") != tt.want {
				t.Errorf("RetryAfter %v: Retry-After %q, want %q", tt.after, hdr.Get("Retry-After"), tt.want)
			}
		}
	})
}

// TestQueued: the wait for admission is in the decision and on proxied
// responses, only when there was one.
func TestQueued(t *testing.T) {
	up := newUpstream(t, http.StatusOK)
	close(up.next)
	for _, tt := range []struct {
		name   string
		queued time.Duration
		want   int64
		header string
	}{
		{"admitted at once", 0, 0, ""},
		{"a short wait rounds up", 1500 * time.Microsecond, 2, "2"},
		{"a wait", 250 * time.Millisecond, 250, "250"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, []kvroute.Replica{up.replica("r0")}, withAsked(&asked{queued: tt.queued}))
			status, hdr, raw := h.post(t, "/v1/route", `{"model":"m","token_ids":[1]}`)
			if status != http.StatusOK {
				t.Fatalf("status %d; body %s", status, raw)
			}
			if got := decodeJSON[api.RouteResponse](t, raw).QueuedMS; got != tt.want || hdr.Get(api.HeaderQueuedMs) != tt.header {
				t.Errorf("queued_ms %d, header %q; want %d, %q", got, hdr.Get(api.HeaderQueuedMs), tt.want, tt.header)
			}
			if tt.want == 0 && strings.Contains(raw, "queued_ms") {
				t.Errorf("queued_ms in an answer that did not wait: %s", raw)
			}
			status, hdr, raw = h.post(t, "/v1/completions", `{"model":"m","prompt":[1]}`)
			if status != http.StatusOK || hdr.Get(api.HeaderQueuedMs) != tt.header {
				t.Errorf("proxied: %d, header %q; want 200, %q; body %s", status, hdr.Get(api.HeaderQueuedMs), tt.header, raw)
			}
		})
	}
}

// TestDecisionDeadline: a decision's deadline is the API's timeout plus
// the wait the request asked for (up to the queue's TTL), so that a
// request waiting in the queue is not cut off as a slow decision.
func TestDecisionDeadline(t *testing.T) {
	const timeout, ttl = time.Second, 45 * time.Second
	left := make(chan time.Duration, 4)
	h := newHarness(t, fleet(1, "m"), func(c *api.Config) {
		c.Timeout, c.MaxQueueWait = timeout, ttl
		api.WithRoute(c, func(ctx context.Context, req router.Request, next api.RouteFunc) (router.Decision, error) {
			dl, ok := ctx.Deadline()
			if !ok {
				left <- -1
			} else {
				left <- time.Until(dl)
			}
			return router.Decision{}, &router.ShedError{Model: "m", Reason: kvroute.ShedNoWait}
		})
	})
	for _, tt := range []struct {
		name, path, body string
		header           []string
		want             time.Duration
	}{
		{"route without a wait", "/v1/route", `{"model":"m","token_ids":[1]}`, nil, timeout},
		{"route with a wait", "/v1/route", `{"model":"m","token_ids":[1],"max_wait_ms":30000}`, nil, timeout + 30*time.Second},
		{"route wait past the TTL", "/v1/route", `{"model":"m","token_ids":[1],"max_wait_ms":3600000}`, nil, timeout + ttl},
		{"proxy up to the TTL", "/v1/completions", `{"model":"m","prompt":[1]}`, nil, timeout + ttl},
		{"proxy bounded", "/v1/completions", `{"model":"m","prompt":[1]}`, []string{api.HeaderMaxWaitMs, "5000"}, timeout + 5*time.Second},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if status, _, raw := h.post(t, tt.path, tt.body, tt.header...); status != http.StatusTooManyRequests {
				t.Fatalf("status %d, want the stand-in's 429; body %s", status, raw)
			}
			// The deadline was set before the stand-in ran: what is left
			// is at most the timeout and the wait, and not much less.
			if got := <-left; got > tt.want || got < tt.want-timeout/2 {
				t.Errorf("deadline in %v, want about %v", got, tt.want)
			}
		})
	}
}
