package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
)

// vllmPriority is a fake vLLM replica as to priorities: started without
// --scheduling-policy priority (refuses), it answers a non-zero priority
// with vLLM's 400; either way it records the bodies it was sent.
type vllmPriority struct {
	srv    *httptest.Server
	bodies chan string
}

func newVLLMPriority(tb testing.TB, refuses bool) *vllmPriority {
	tb.Helper()
	v := &vllmPriority{bodies: make(chan string, 16)}
	v.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		v.bodies <- string(b)
		var body struct{ Priority int }
		_ = json.Unmarshal(b, &body)
		w.Header().Set("Content-Type", "application/json")
		switch {
		case strings.Contains(string(b), `"bad-request"`):
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"object":"error","message":"bad-request","type":"BadRequestError","param":null,"code":400}`)
		case refuses && body.Priority != 0:
			w.WriteHeader(http.StatusBadRequest)
			io.WriteString(w, `{"object":"error","message":"Got priority 3 but Priority scheduling is not enabled.","type":"BadRequestError","param":null,"code":400}`)
		default:
			io.WriteString(w, `{"choices":[{"text":"hi"}]}`)
		}
	}))
	tb.Cleanup(v.srv.Close)
	return v
}

// sent is every body the replica received since the last call.
func (v *vllmPriority) sent(tb testing.TB) []string {
	tb.Helper()
	var out []string
	for {
		select {
		case b := <-v.bodies:
			out = append(out, b)
		default:
			return out
		}
	}
}

// priorities is, per body, its priority field as sent ("-" for none).
func priorities(tb testing.TB, bodies []string) string {
	tb.Helper()
	var out []string
	for _, b := range bodies {
		var top map[string]json.RawMessage
		if err := json.Unmarshal([]byte(b), &top); err != nil {
			tb.Fatalf("replica got %q: %v", b, err)
		}
		p, ok := top["priority"]
		if !ok {
			p = json.RawMessage("-")
		}
		out = append(out, string(p))
	}
	return strings.Join(out, " ")
}

// TestPriorityForwarding: vLLM's priority field reaches only a replica
// registered as scheduling by priority (a header's priority is put in
// it), after a failover too.
func TestPriorityForwarding(t *testing.T) {
	completion := func(extra string) string { return `{"model":"m","prompt":[1,2,3]` + extra + `}` }
	for _, tt := range []struct {
		name       string
		scheduling bool
		body       string
		header     []string
		want       string
	}{
		{"no scheduling: stripped", false, completion(`,"priority":3`), nil, "-"},
		{"no scheduling: zero stripped", false, completion(`,"priority":0`), nil, "-"},
		{"no scheduling: header not added", false, completion(""), []string{api.HeaderPriority, "3"}, "-"},
		{"no priority at all", true, completion(""), nil, "-"},
		{"scheduling: as sent", true, completion(`,"priority": -2`), nil, "-2"},
		{"scheduling: header added", true, completion(""), []string{api.HeaderPriority, "5"}, "5"},
		{"scheduling: header zero not added", true, completion(""), []string{api.HeaderPriority, "0"}, "-"},
		{"scheduling: stream", true, completion(`,"priority":1,"stream":true`), nil, "1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := newVLLMPriority(t, false)
			h := newHarness(t, []kvroute.Replica{{ID: "r0", Model: "m", URL: v.srv.URL, PriorityScheduling: tt.scheduling}})
			status, _, raw := h.post(t, "/v1/completions", tt.body, tt.header...)
			if status != http.StatusOK {
				t.Fatalf("status %d; body %s", status, raw)
			}
			if got := priorities(t, v.sent(t)); got != tt.want {
				t.Errorf("replica got priority %s, want %s", got, tt.want)
			}
		})
	}

	t.Run("failover to a replica without scheduling", func(t *testing.T) {
		v := newVLLMPriority(t, false)
		h := newHarness(t, []kvroute.Replica{
			{ID: "dead", Model: "m", URL: deadURL(t), PriorityScheduling: true},
			{ID: "live", Model: "m", URL: v.srv.URL},
		})
		// Whichever the decision picks first, the live replica answers
		// (a dead one fails over to it) and gets no priority field.
		status, hdr, raw := h.post(t, "/v1/completions", completion(`,"priority":3`))
		if status != http.StatusOK || hdr.Get(api.HeaderReplica) != "live" {
			t.Fatalf("got %d from %q, want 200 from live; body %s", status, hdr.Get(api.HeaderReplica), raw)
		}
		if got := priorities(t, v.sent(t)); got != "-" {
			t.Errorf("live replica got priorities %q, want none", got)
		}
	})
}

// TestPriorityRefused: a replica registered with priority scheduling
// that refuses a priority all the same gets the request again without
// it, and keeps getting it without until its registration changes;
// another 400 is the client's, passed on whole.
func TestPriorityRefused(t *testing.T) {
	completion := func(extra string) string { return `{"model":"m","prompt":[1,2,3]` + extra + `}` }
	t.Run("refused", func(t *testing.T) {
		v := newVLLMPriority(t, true)
		rep := kvroute.Replica{ID: "r0", Model: "m", URL: v.srv.URL, PriorityScheduling: true}
		h := newHarness(t, []kvroute.Replica{rep})
		send := func(t *testing.T, want string) {
			t.Helper()
			status, _, raw := h.post(t, "/v1/completions", completion(`,"priority":3`))
			if status != http.StatusOK {
				t.Fatalf("status %d, want 200 (retried without the priority); body %s", status, raw)
			}
			if got := priorities(t, v.sent(t)); got != want {
				t.Errorf("replica got priorities %q, want %q", got, want)
			}
		}
		register := func(t *testing.T, scheduling bool) {
			t.Helper()
			b, _ := json.Marshal(kvroute.Replica{Model: "m", URL: v.srv.URL, PriorityScheduling: scheduling})
			if status, _, raw := h.do(t, http.MethodPut, "/v1/replicas/r0", "application/json", string(b)); status != http.StatusOK {
				t.Fatalf("re-register: %d %s", status, raw)
			}
		}
		t.Run("retried once without it", func(t *testing.T) { send(t, "3 -") })
		t.Run("remembered", func(t *testing.T) { send(t, "-") })
		t.Run("registration unchanged: still remembered", func(t *testing.T) {
			register(t, true)
			send(t, "-")
		})
		t.Run("forgotten when the registration changes", func(t *testing.T) {
			register(t, false)
			send(t, "-")
			register(t, true)
			send(t, "3 -")
		})
	})

	t.Run("another 400 is the client's", func(t *testing.T) {
		v := newVLLMPriority(t, false)
		h := newHarness(t, []kvroute.Replica{{ID: "r0", Model: "m", URL: v.srv.URL, PriorityScheduling: true}})
		status, _, raw := h.post(t, "/v1/completions", completion(`,"priority":3,"user":"bad-request"`))
		want := `{"object":"error","message":"bad-request","type":"BadRequestError","param":null,"code":400}`
		if status != http.StatusBadRequest || raw != want {
			t.Errorf("got %d %s, want 400 %s", status, raw, want)
		}
		if got := priorities(t, v.sent(t)); got != "3" {
			t.Errorf("replica got priorities %q, want one request with 3", got)
		}
	})
}
