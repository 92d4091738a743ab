package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/tokenizer/template"
)

// chatTemplate is a small real template: role markers, then the content.
const chatTemplate = `{% for m in messages %}{% if m.role == 'bad' %}{{ raise_exception('roles must be user or assistant') }}{% endif %}<|{{ m.role }}|>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}`

// withLocalModel gives the API a front door that tokenizes model "m"
// itself, and a metrics registry to read.
func withLocalModel(tb testing.TB, reg *prometheus.Registry) option {
	tb.Helper()
	tmpl, err := template.Parse(chatTemplate, nil, template.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	// Its files are trusted (VerifyMatches < 0): TestForwardingVerified
	// covers the verification.
	return withPrompts(tb, reg, prompt.Config{Models: map[string]*prompt.Model{"m": {Encoder: mock.ByteEncoder{}, Template: tmpl}}, VerifyMatches: -1})
}

// withPrompts gives the API a front door built from cfg, and the API's
// metrics in reg.
func withPrompts(tb testing.TB, reg *prometheus.Registry, cfg prompt.Config) option {
	tb.Helper()
	metrics := withRegistry(tb, reg)
	r, err := prompt.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(r.Close)
	return func(c *api.Config) {
		c.Prompts = r
		metrics(c)
	}
}

func TestRouteFrontDoor(t *testing.T) {
	reg := prometheus.NewRegistry()
	h := newHarness(t, []kvroute.Replica{{ID: "r0", Model: "m", URL: "http://replica-0:8000"}, {ID: "x0", Model: "other", URL: "http://x:8000"}}, withLocalModel(t, reg))
	for _, tc := range []struct {
		name, body   string
		tokenization string
		tokens       int
		blind        string
	}{
		{"token ids", `{"model":"m","token_ids":[1,2,3]}`, "given", 3, ""},
		{"text", `{"model":"m","prompt":"hello"}`, "local", 6, ""},
		{"text without special tokens", `{"model":"m","prompt":"hello","add_special_tokens":false}`, "local", 5, ""},
		{"chat", `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, "local", len("<|user|>hi<|assistant|>"), ""},
		{"chat, no generation prompt", `{"model":"m","messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}`, "local", len("<|user|>hi"), ""},
		{"a model nobody tokenizes", `{"model":"other","prompt":"hello"}`, "none", 0, prompt.BlindNoTokenizer},
	} {
		t.Run(tc.name, func(t *testing.T) {
			status, hdr, raw := h.post(t, "/v1/route", tc.body)
			if status != http.StatusOK {
				t.Fatalf("status %d: %s", status, raw)
			}
			got := decodeJSON[api.RouteResponse](t, raw)
			if got.Tokenization != tc.tokenization || got.PromptTokens != tc.tokens || got.CacheBlind != tc.blind {
				t.Errorf("tokenization %q, %d tokens, blind %q; want %q, %d, %q", got.Tokenization, got.PromptTokens, got.CacheBlind, tc.tokenization, tc.tokens, tc.blind)
			}
			if hdr.Get(api.HeaderTokenization) != tc.tokenization || hdr.Get(api.HeaderDegradedReason) != tc.blind {
				t.Errorf("headers %s=%q %s=%q", api.HeaderTokenization, hdr.Get(api.HeaderTokenization), api.HeaderDegradedReason, hdr.Get(api.HeaderDegradedReason))
			}
		})
	}
	t.Run("a prompt the template refuses", func(t *testing.T) {
		status, _, raw := h.post(t, "/v1/route", `{"model":"m","messages":[{"role":"bad","content":"x"}]}`)
		got := decodeJSON[api.ErrorBody](t, raw).Error
		if status != http.StatusBadRequest || got.Field != "messages" || !strings.Contains(got.Message, "roles must be user or assistant") {
			t.Errorf("got %d %+v, want 400 on messages with the template's message", status, got)
		}
	})
	t.Run("cache-blind decisions are counted by reason", func(t *testing.T) {
		if got := testutil.ToFloat64(mustCounter(t, reg, "kvroute_decisions_cache_blind_total", "reason", prompt.BlindNoTokenizer)); got != 1 {
			t.Errorf("cache-blind decisions = %v, want 1", got)
		}
	})
	t.Run("models", func(t *testing.T) {
		status, _, raw := h.do(t, http.MethodGet, "/v1/models", "", "")
		got := decodeJSON[api.ModelList](t, raw)
		want := []api.ModelInfo{
			{ID: "m", Object: "model", OwnedBy: "kvroute", Replicas: 1, Routable: 1, Tokenizer: "local"},
			{ID: "other", Object: "model", OwnedBy: "kvroute", Replicas: 1, Routable: 1, Tokenizer: "remote"},
		}
		if status != http.StatusOK || got.Object != "list" || !slices.Equal(got.Data, want) {
			t.Errorf("got %d %+v, want %+v", status, got, want)
		}
	})
}

// mustCounter finds one labelled counter in a registry.
func mustCounter(tb testing.TB, reg *prometheus.Registry, name, label, value string) prometheus.Collector {
	tb.Helper()
	fams, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == label && l.GetValue() == value {
					c := prometheus.NewCounter(prometheus.CounterOpts{Name: name})
					c.Add(m.GetCounter().GetValue())
					return c
				}
			}
		}
	}
	tb.Fatalf("no %s{%s=%q}", name, label, value)
	return nil
}

// usageUpstream answers like vLLM with --enable-prompt-tokens-details:
// cached tokens in usage, and a usage-only last chunk when a stream asks.
func usageUpstream(tb testing.TB, cached int) (*httptest.Server, chan string) {
	tb.Helper()
	bodies := make(chan string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		bodies <- string(b)
		var req struct {
			Stream        bool `json:"stream"`
			StreamOptions struct {
				IncludeUsage bool `json:"include_usage"`
			} `json:"stream_options"`
		}
		_ = json.Unmarshal(b, &req)
		u := `{"prompt_tokens":40,"completion_tokens":2,"total_tokens":42,"prompt_tokens_details":{"cached_tokens":` + itoa(cached) + `}}`
		if !req.Stream {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"c1","choices":[{"text":"ok"}],"usage":`+u+`}`)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: {\"id\":\"c1\",\"choices\":[{\"text\":\"o\"}],\"usage\":null}\n\n")
		io.WriteString(w, "data: {\"id\":\"c1\",\"choices\":[{\"text\":\"k\"}],\"usage\":null}\n\n")
		if req.StreamOptions.IncludeUsage {
			io.WriteString(w, "data: {\"id\":\"c1\",\"choices\":[],\"usage\":"+u+"}\n\n")
		}
		io.WriteString(w, "data: [DONE]\n\n")
	}))
	tb.Cleanup(srv.Close)
	return srv, bodies
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func TestProxyFrontDoor(t *testing.T) {
	srv, bodies := usageUpstream(t, 0)
	reg := prometheus.NewRegistry()
	h := newHarness(t, []kvroute.Replica{{ID: "r0", Model: "m", URL: srv.URL}}, withLocalModel(t, reg))
	text := strings.Repeat("a", 40)

	t.Run("a text prompt is forwarded as kvroute's ids", func(t *testing.T) {
		status, hdr, raw := h.post(t, "/v1/completions", `{"model":"m","prompt":"`+text+`","max_tokens":2}`)
		if status != http.StatusOK || hdr.Get(api.HeaderTokenization) != "local" {
			t.Fatalf("got %d tokenization %q: %s", status, hdr.Get(api.HeaderTokenization), raw)
		}
		var fw struct {
			Prompt []uint32 `json:"prompt"`
		}
		if err := json.Unmarshal([]byte(<-bodies), &fw); err != nil || !slices.Equal(fw.Prompt, mock.ByteEncoder{}.IDs(text, true)) {
			t.Errorf("forwarded prompt %v (%v), want the ids kvroute keyed", fw.Prompt, err)
		}
	})
	t.Run("forwarding off", func(t *testing.T) {
		h := newHarness(t, []kvroute.Replica{{ID: "r0", Model: "m", URL: srv.URL}}, withLocalModel(t, prometheus.NewRegistry()), func(c *api.Config) { c.NoTokenForwarding = true })
		body := `{"model":"m","prompt":"` + text + `"}`
		if status, _, raw := h.post(t, "/v1/completions", body); status != http.StatusOK {
			t.Fatalf("got %d: %s", status, raw)
		}
		if got := <-bodies; got != body {
			t.Errorf("forwarded %s, want the client's body", got)
		}
	})
	t.Run("chat is keyed, forwarded as sent", func(t *testing.T) {
		body := `{"model":"m","messages":[{"role":"user","content":"` + text + `"}]}`
		status, hdr, raw := h.post(t, "/v1/chat/completions", body)
		if status != http.StatusOK || hdr.Get(api.HeaderTokenization) != "local" || hdr.Get(api.HeaderDegradedReason) != "" {
			t.Fatalf("got %d tokenization %q reason %q: %s", status, hdr.Get(api.HeaderTokenization), hdr.Get(api.HeaderDegradedReason), raw)
		}
		if got := <-bodies; got != body {
			t.Errorf("forwarded %s, want the client's body", got)
		}
	})
	t.Run("a stream's usage chunk, asked for by kvroute, never reaches the client", func(t *testing.T) {
		status, _, raw := h.post(t, "/v1/completions", `{"model":"m","prompt":"`+text+`","stream":true}`)
		<-bodies
		if status != http.StatusOK || strings.Contains(raw, `"usage":{`) || !strings.Contains(raw, "data: [DONE]") || strings.Count(raw, "data: ") != 3 {
			t.Errorf("client got %d %q, want the two text chunks and [DONE]", status, raw)
		}
	})
	t.Run("a client that asked keeps it", func(t *testing.T) {
		_, _, raw := h.post(t, "/v1/completions", `{"model":"m","prompt":"`+text+`","stream":true,"stream_options":{"include_usage":true}}`)
		<-bodies
		if !strings.Contains(raw, `"cached_tokens":0`) {
			t.Errorf("client got %q, want its usage chunk", raw)
		}
	})
	t.Run("believed and served are counted", func(t *testing.T) {
		if got := testutil.ToFloat64(mustCounter(t, reg, "kvroute_cache_compared_total", "replica", "r0")); got != 4 {
			t.Errorf("compared = %v, want 4 (every proxied response above reported usage)", got)
		}
	})
}

func TestBelievedVersusServed(t *testing.T) {
	for _, tc := range []struct {
		name    string
		served  int
		phantom float64
	}{
		{"served what was believed", 32, 0},
		{"served less: a phantom", 0, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, bodies := usageUpstream(t, tc.served)
			reg := prometheus.NewRegistry()
			h := newHarness(t, []kvroute.Replica{{ID: "r0", Model: "m", URL: srv.URL, Events: "tcp://127.0.0.1:1"}}, withLocalModel(t, reg))
			// The index says r0 holds the prompt's first two blocks (of
			// 16 tokens; 41 tokens in all).
			text := strings.Repeat("b", 40)
			ids := mock.ByteEncoder{}.IDs(text, true)
			h.store.Hold("r0", h.keys(t, ids))
			status, _, raw := h.post(t, "/v1/completions", `{"model":"m","prompt":"`+text+`"}`)
			<-bodies
			if status != http.StatusOK {
				t.Fatalf("got %d: %s", status, raw)
			}
			if got := testutil.ToFloat64(mustCounter(t, reg, "kvroute_cached_tokens_believed_total", "replica", "r0")); got != 32 {
				t.Errorf("believed = %v, want 32", got)
			}
			if tc.phantom > 0 {
				if got := testutil.ToFloat64(mustCounter(t, reg, "kvroute_cache_phantom_total", "replica", "r0")); got != tc.phantom {
					t.Errorf("phantom = %v, want %v", got, tc.phantom)
				}
			}
		})
	}
}
