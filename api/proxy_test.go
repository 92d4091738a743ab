package api_test

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/internal/wait"
)

// upstream is a fake vLLM replica that records what it was sent.
type upstream struct {
	srv  *httptest.Server
	got  chan recorded
	next chan struct{} // closed to let a stream finish
}

type recorded struct {
	path, body string
	header     http.Header
}

func newUpstream(tb testing.TB, status int) *upstream {
	tb.Helper()
	u := &upstream{got: make(chan recorded, 8), next: make(chan struct{})}
	u.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		u.got <- recorded{path: r.URL.Path, body: string(b), header: r.Header.Clone()}
		if status != http.StatusOK {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(status)
			io.WriteString(w, `{"error":{"message":"bad"}}`)
			return
		}
		if !strings.Contains(string(b), `"stream":true`) {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"choices":[{"text":"hi"}]}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: 1\n\n")
		w.(http.Flusher).Flush()
		<-u.next
		io.WriteString(w, "data: 2\n\ndata: [DONE]\n\n")
	}))
	tb.Cleanup(func() {
		select {
		case <-u.next:
		default:
			close(u.next)
		}
		u.srv.Close()
	})
	return u
}

func (u *upstream) replica(id string) kvroute.Replica {
	return kvroute.Replica{ID: id, Model: "m", URL: u.srv.URL}
}

func (u *upstream) received(tb testing.TB) recorded {
	tb.Helper()
	select {
	case r := <-u.got:
		return r
	case <-time.After(5 * time.Second):
		tb.Fatal("upstream received nothing")
		return recorded{}
	}
}

func TestProxyStreaming(t *testing.T) {
	up := newUpstream(t, http.StatusOK)
	h := newHarness(t, []kvroute.Replica{up.replica("r0")})
	body := `{"model":"m","prompt":` + tokenJSON(0, 64) + `,"stream":true,"max_tokens":32}`
	resp, err := http.Post(h.srv.URL+"/v1/completions", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	id := resp.Header.Get(api.HeaderRequestID)

	t.Run("headers", func(t *testing.T) {
		if resp.StatusCode != http.StatusOK || resp.Header.Get(api.HeaderReplica) != "r0" || id == "" {
			t.Errorf("status %d replica %q request id %q", resp.StatusCode, resp.Header.Get(api.HeaderReplica), id)
		}
		if got := resp.Header.Get(api.HeaderDegradedReason); got != "" {
			t.Errorf("degraded reason %q for a token prompt", got)
		}
	})
	t.Run("body forwarded, asking for the usage chunk", func(t *testing.T) {
		got := up.received(t)
		want := `{"max_tokens":32,"model":"m","prompt":` + tokenJSON(0, 64) + `,"stream":true,"stream_options":{"include_usage":true}}`
		if got.path != "/v1/completions" || got.body != want {
			t.Errorf("upstream got %s %q, want /v1/completions and %q", got.path, got.body, want)
		}
	})
	t.Run("lease sized by the prompt", func(t *testing.T) {
		l, ok := h.store.Lease(id)
		if !ok || l.PrefillBlocks != 4 {
			t.Errorf("lease = %+v (found %v), want the prompt's 4 uncached blocks of prefill", l, ok)
		}
	})

	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if sc.Text() != "" {
				lines <- sc.Text()
			}
		}
		close(lines)
	}()
	next := func(t *testing.T) (string, bool) {
		t.Helper()
		select {
		case l, ok := <-lines:
			return l, ok
		case <-time.After(5 * time.Second):
			t.Fatal("no stream data within 5s: the proxy does not flush")
			return "", false
		}
	}
	t.Run("first chunk arrives before the stream ends", func(t *testing.T) {
		if got, _ := next(t); got != "data: 1" {
			t.Fatalf("first line %q, want data: 1", got)
		}
		// The first-token report runs off the stream's path (a
		// goroutine): wait for it, boundedly.
		wait.Until(t, "the first-token report", func() bool { return slices.Contains(h.store.Calls(), "advance "+id) })
		if calls := h.store.Calls(); slices.Contains(calls, "release "+id) {
			t.Errorf("calls mid-stream = %v, want advance and no release", calls)
		}
	})
	close(up.next)
	t.Run("release after the end", func(t *testing.T) {
		var rest []string
		for l, ok := next(t); ok; l, ok = next(t) {
			rest = append(rest, l)
		}
		if want := []string{"data: 2", "data: [DONE]"}; !slices.Equal(rest, want) {
			t.Errorf("rest of stream %q, want %q", rest, want)
		}
		want := []string{"advance " + id, "release " + id}
		if got := h.store.Calls(); !slices.Equal(got, want) {
			t.Errorf("calls = %v, want %v", got, want)
		}
		if l := h.store.Load("r0"); l.Requests != 0 || l.DecodeBlocks != 0 {
			t.Errorf("load after the stream = %+v, want zero", l)
		}
	})
}

// TestProxyReleaseAfterFirstToken: a non-streaming answer's first bytes
// and its end reach the proxy together. The first-token report, made off
// the answer's path, must still reach the store before the release, or
// the store takes the request for one that ended before its prefill ran
// (and withdraws the prediction its booking wrote). The report here is
// held until the replica has sent its whole answer, when the release is
// due.
func TestProxyReleaseAfterFirstToken(t *testing.T) {
	sent := make(chan struct{})
	up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"choices":[{"text":"hi"}]}`)
		w.(http.Flusher).Flush()
		close(sent)
	}))
	t.Cleanup(up.Close)
	mem := mock.NewMemory(kvroute.Replica{ID: "r0", Model: "m", URL: up.URL})
	idx := mem.Index()
	advance := idx.AdvanceFn
	idx.AdvanceFn = func(ctx context.Context, id string) (bool, error) {
		<-sent
		return advance(ctx, id)
	}
	h := harnessOver(t, mem, idx)
	status, hdr, raw := h.post(t, "/v1/completions", `{"model":"m","prompt":[1,2,3],"max_tokens":2}`)
	if status != http.StatusOK {
		t.Fatalf("got %d %s, want 200", status, raw)
	}
	id := hdr.Get(api.HeaderRequestID)
	var calls []string
	wait.Until(t, "the release reaches the store", func() bool {
		calls = h.store.Calls()
		return slices.Contains(calls, "release "+id)
	})
	adv, rel := slices.Index(calls, "advance "+id), slices.Index(calls, "release "+id)
	if adv < 0 || adv > rel {
		t.Errorf("calls %v: got the first token at %d and the release at %d, want the first token first", calls, adv, rel)
	}
}

func TestProxy(t *testing.T) {
	up := newUpstream(t, http.StatusOK)
	h := newHarness(t, []kvroute.Replica{up.replica("r0")})

	t.Run("chat without tokenizer", func(t *testing.T) {
		body := `{"model":"m","messages":[{"role":"user","content":"hello"}]}`
		status, hdr, raw := h.post(t, "/v1/chat/completions", body, "X-Session-Id", "s1")
		if status != http.StatusOK || raw != `{"choices":[{"text":"hi"}]}` {
			t.Fatalf("got %d %s", status, raw)
		}
		if got := hdr.Get(api.HeaderDegradedReason); got != api.ReasonNoTokenizer {
			t.Errorf("degraded reason %q, want %q", got, api.ReasonNoTokenizer)
		}
		got := up.received(t)
		if got.path != "/v1/chat/completions" || got.body != body || got.header.Get("X-Session-Id") != "s1" {
			t.Errorf("upstream got %s %q session %q", got.path, got.body, got.header.Get("X-Session-Id"))
		}
		if calls := h.store.Calls(); !slices.Contains(calls, "release "+hdr.Get(api.HeaderRequestID)) {
			t.Errorf("calls %v lack the release", calls)
		}
	})
	t.Run("text prompt without tokenizer", func(t *testing.T) {
		status, hdr, raw := h.post(t, "/v1/completions", `{"model":"m","prompt":"once upon"}`)
		if status != http.StatusOK || hdr.Get(api.HeaderDegradedReason) != api.ReasonNoTokenizer {
			t.Errorf("got %d reason %q: %s", status, hdr.Get(api.HeaderDegradedReason), raw)
		}
		up.received(t)
	})
	t.Run("batch of token prompts", func(t *testing.T) {
		status, hdr, raw := h.post(t, "/v1/completions", `{"model":"m","prompt":[[1,2,3],[4]]}`)
		if status != http.StatusOK || hdr.Get(api.HeaderDegradedReason) != "" {
			t.Errorf("got %d reason %q: %s", status, hdr.Get(api.HeaderDegradedReason), raw)
		}
		up.received(t)
	})

	for _, tt := range []struct {
		name, path, body string
		wantStatus       int
		wantField        string
	}{
		{"bad token in prompt", "/v1/completions", `{"model":"m","prompt":[1,-2]}`, 400, "prompt"},
		{"model missing", "/v1/completions", `{"prompt":[1]}`, 400, "model"},
		{"malformed", "/v1/chat/completions", `{"model":`, 400, ""},
		{"unknown model", "/v1/completions", `{"model":"x","prompt":[1]}`, 404, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// The OpenAI endpoints answer in OpenAI's error shape: the
			// field at fault is its param.
			status, _, raw := h.post(t, tt.path, tt.body)
			got := decodeJSON[api.OpenAIErrorBody](t, raw).Error
			param := ""
			if got.Param != nil {
				param = *got.Param
			}
			if status != tt.wantStatus || param != tt.wantField || got.Type == "" || got.Message == "" {
				t.Errorf("got %d %s, want %d naming %q", status, raw, tt.wantStatus, tt.wantField)
			}
		})
	}
}

func TestProxyUpstreamFailure(t *testing.T) {
	t.Run("unreachable", func(t *testing.T) {
		dead := httptest.NewServer(http.NotFoundHandler())
		dead.Close()
		h := newHarness(t, []kvroute.Replica{{ID: "r0", Model: "m", URL: dead.URL}})
		status, hdr, raw := h.post(t, "/v1/completions", `{"model":"m","prompt":[1,2,3]}`)
		if status != http.StatusBadGateway || decodeJSON[api.ErrorBody](t, raw).Error.Code != "upstream_error" {
			t.Fatalf("got %d %s, want 502 upstream_error", status, raw)
		}
		id := hdr.Get(api.HeaderRequestID)
		if want := []string{"release " + id}; !slices.Equal(h.store.Calls(), want) {
			t.Errorf("calls = %v, want %v", h.store.Calls(), want)
		}
	})
	t.Run("error status passes through", func(t *testing.T) {
		up := newUpstream(t, http.StatusBadRequest)
		h := newHarness(t, []kvroute.Replica{up.replica("r0")})
		status, hdr, raw := h.post(t, "/v1/completions", `{"model":"m","prompt":[1,2,3]}`)
		if status != http.StatusBadRequest || raw != `{"error":{"message":"bad"}}` {
			t.Fatalf("got %d %s, want the replica's 400", status, raw)
		}
		id := hdr.Get(api.HeaderRequestID)
		if want := []string{"release " + id}; !slices.Equal(h.store.Calls(), want) {
			t.Errorf("calls = %v, want only %v (no first token on an error)", h.store.Calls(), want)
		}
	})
}
