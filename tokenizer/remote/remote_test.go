package remote_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/tokenizer/remote"
)

// replica is a stand-in vLLM API server recording what it was asked.
type replica struct {
	render bool // serves the render endpoints
	status int  // answer every call with this status, when set
	calls  atomic.Int64
	last   atomic.Value // map[string]any: the last body
	paths  atomic.Value // string: the last path
}

func (rp *replica) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rp.calls.Add(1)
	var body map[string]any
	raw, _ := io.ReadAll(r.Body)
	_ = json.Unmarshal(raw, &body)
	rp.last.Store(body)
	rp.paths.Store(r.URL.Path)
	if rp.status != 0 {
		w.WriteHeader(rp.status)
		_, _ = io.WriteString(w, `{"error":{"message":"Conversation roles must alternate user/assistant","type":"BadRequestError","code":400}}`)
		return
	}
	switch {
	case r.URL.Path == "/tokenize":
		_ = json.NewEncoder(w).Encode(map[string]any{"count": 3, "max_model_len": 4096, "tokens": []int{1, 2, 3}})
	case strings.HasSuffix(r.URL.Path, "/render") && rp.render:
		_ = json.NewEncoder(w).Encode(map[string]any{"token_ids": []int{4, 5, 6}})
	default:
		http.NotFound(w, r)
	}
}

func client(t *testing.T, reps ...*replica) *remote.Client {
	t.Helper()
	var fleet []kvroute.Replica
	for i, rp := range reps {
		srv := httptest.NewServer(rp)
		t.Cleanup(srv.Close)
		fleet = append(fleet, kvroute.Replica{ID: string(rune('a' + i)), Model: "m", URL: srv.URL})
	}
	c, err := remote.New(remote.Config{Replicas: func(context.Context, string) ([]kvroute.Replica, error) { return fleet, nil }})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func TestTokenize(t *testing.T) {
	text := "hello"
	no := false
	t.Run("tokenize endpoint", func(t *testing.T) {
		rp := &replica{}
		c := client(t, rp)
		for range 2 {
			got, err := c.Tokenize(context.Background(), kvroute.TokenizeRequest{Model: "m", Prompt: &text})
			if err != nil || !slices.Equal(got, []uint32{1, 2, 3}) {
				t.Fatalf("Tokenize = %v, %v; want [1 2 3]", got, err)
			}
		}
		if n := rp.calls.Load(); n != 3 {
			t.Errorf("calls = %d, want 3: one render probe, then /tokenize twice", n)
		}
		body := rp.last.Load().(map[string]any)
		if body["prompt"] != "hello" || body["add_special_tokens"] != true {
			t.Errorf("body = %v, want the prompt with add_special_tokens true", body)
		}
	})
	t.Run("chat through render", func(t *testing.T) {
		rp := &replica{render: true}
		c := client(t, rp)
		got, err := c.Tokenize(context.Background(), kvroute.TokenizeRequest{
			Model: "m", Messages: json.RawMessage(`[{"role":"user","content":"hi"}]`),
			ChatTemplateKwargs: json.RawMessage(`{"enable_thinking":false}`), AddGenerationPrompt: &no,
		})
		if err != nil || !slices.Equal(got, []uint32{4, 5, 6}) {
			t.Fatalf("Tokenize = %v, %v; want [4 5 6]", got, err)
		}
		if p := rp.paths.Load().(string); p != "/v1/chat/completions/render" {
			t.Errorf("path = %s, want the chat render endpoint", p)
		}
		body := rp.last.Load().(map[string]any)
		if body["add_generation_prompt"] != false || body["chat_template_kwargs"] == nil || body["messages"] == nil {
			t.Errorf("body = %v, want messages, kwargs and add_generation_prompt false", body)
		}
	})
	t.Run("refused: the replica's message, as the client's error", func(t *testing.T) {
		c := client(t, &replica{status: http.StatusBadRequest})
		_, err := c.Tokenize(context.Background(), kvroute.TokenizeRequest{Model: "m", Messages: json.RawMessage(`[]`)})
		var fe *kvroute.FieldError
		if !errors.As(err, &fe) || fe.Field != "messages" || !strings.Contains(fe.Msg, "roles must alternate") {
			t.Errorf("err = %v, want a field error on messages with the replica's message", err)
		}
	})
	t.Run("a failing replica: the next one", func(t *testing.T) {
		bad, good := &replica{status: http.StatusInternalServerError}, &replica{}
		c := client(t, bad, good)
		for range 2 {
			if _, err := c.Tokenize(context.Background(), kvroute.TokenizeRequest{Model: "m", Prompt: &text}); err != nil {
				t.Fatalf("Tokenize: %v", err)
			}
		}
		if bad.calls.Load() == 0 {
			t.Error("the failing replica was never tried; the test proves nothing")
		}
	})
	t.Run("no replica", func(t *testing.T) {
		c := client(t)
		if _, err := c.Tokenize(context.Background(), kvroute.TokenizeRequest{Model: "m", Prompt: &text}); !errors.Is(err, kvroute.ErrNoReplica) {
			t.Errorf("err = %v, want ErrNoReplica", err)
		}
	})
}
