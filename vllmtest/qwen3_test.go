package vllmtest_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
	"github.com/kvroute/kvroute/tokenizer/qwen3"
	"github.com/kvroute/kvroute/tokenizer/template"
	"github.com/kvroute/kvroute/vllmtest"
)

// The tests here run a replica with the real Qwen3 tokenizer and chat
// template, as the demo does, and compute every expected id list with the
// tokenizer and template directly: the replica must cache exactly what a
// router computing the same ids keys.

// loadQwen3 parses the embedded Qwen3 files once for the whole package;
// loading takes about half a second.
var loadQwen3 = sync.OnceValues(func() (*tokenizer.Tokenizer, error) { return qwen3.Load() })

func qwen3Files(tb testing.TB) (*tokenizer.Tokenizer, *template.Template) {
	tb.Helper()
	tok, err := loadQwen3()
	if err != nil {
		tb.Fatal(err)
	}
	tmpl, err := template.LoadFS(qwen3.FS, ".", template.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	return tok, tmpl
}

// postStatus sends body and returns the status and the raw answer, for
// requests that may be refused.
func postStatus(tb testing.TB, url string, body any) (int, []byte) {
	tb.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		tb.Fatal(err)
	}
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, raw
}

// ints converts tokenizer ids to the replica's []int.
func ints(ids []uint32) []int {
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out
}

// direct computes a chat's ids as vLLM would: render, then tokenize with
// add_special_tokens false.
func direct(tb testing.TB, tok *tokenizer.Tokenizer, tmpl *template.Template, req template.Request) []int {
	tb.Helper()
	res, err := tmpl.Render(req)
	if err != nil {
		tb.Fatal(err)
	}
	ids, err := tok.Encode(res.Prompt, false)
	if err != nil {
		tb.Fatal(err)
	}
	return ints(ids)
}

const longSystem = "You are a terse assistant for the kvroute project. Answer in one sentence, " +
	"cite the file you read, and never invent configuration flags that do not exist."

func TestQwen3Parity(t *testing.T) {
	tok, tmpl := qwen3Files(t)
	const bs = 16
	r := start(t, vllmtest.Config{BlockSize: bs, Tokenizer: tokenizer.NewCache(tok, 1<<20), ChatTemplate: tmpl})

	msgs := json.RawMessage(`[{"role":"system","content":"` + longSystem + `"},{"role":"user","content":"Where is the block size set?"}]`)
	tools := json.RawMessage(`[{"type":"function","function":{"name":"read_file","description":"Read a file.","parameters":{"type":"object","properties":{"path":{"type":"string"}},"required":["path"]}}}]`)
	text := "The same prompt, tokenized by Qwen3: 你好 😀 x := 42"

	t.Run("tokenize prompt", func(t *testing.T) {
		for _, special := range []bool{true, false} {
			ids, _ := tok.Encode(text, special)
			var got tokenizeAnswer
			post(t, r.URL()+"/tokenize", map[string]any{"prompt": text, "add_special_tokens": special}, &got)
			if want := ints(ids); !slices.Equal(got.Tokens, want) || got.Count != len(want) || got.MaxModelLen != 32768 {
				t.Errorf("add_special_tokens %v: /tokenize = %+v, want tokens %v", special, got, want)
			}
		}
		want, _ := tok.Encode(text, true)
		if got := r.Tokenize(text); !slices.Equal(got, ints(want)) {
			t.Errorf("Tokenize = %v, want %v", got, want)
		}
	})
	t.Run("tokenize messages", func(t *testing.T) {
		var got tokenizeAnswer
		post(t, r.URL()+"/tokenize", map[string]any{"messages": msgs, "tools": tools}, &got)
		if want := direct(t, tok, tmpl, template.Request{Messages: msgs, Tools: tools}); !slices.Equal(got.Tokens, want) || got.Count != len(want) {
			t.Errorf("/tokenize = %v, want %v", got.Tokens, want)
		}
	})
	t.Run("completions render", func(t *testing.T) {
		var got struct {
			TokenIDs []int `json:"token_ids"`
		}
		post(t, r.URL()+"/v1/completions/render", map[string]any{"model": "sim-model", "prompt": text, "max_tokens": 4}, &got)
		want, _ := tok.Encode(text, true)
		if !slices.Equal(got.TokenIDs, ints(want)) {
			t.Errorf("token_ids = %v, want %v", got.TokenIDs, want)
		}
	})
	chats := []struct {
		name string
		body map[string]any
		req  template.Request
	}{
		{"plain", map[string]any{"messages": msgs}, template.Request{Messages: msgs}},
		{"tools and kwargs", map[string]any{"messages": msgs, "tools": tools, "chat_template_kwargs": map[string]any{"enable_thinking": false}},
			template.Request{Messages: msgs, Tools: tools, Kwargs: json.RawMessage(`{"enable_thinking":false}`)}},
		{"continue final message", map[string]any{"messages": json.RawMessage(`[{"role":"user","content":"Say hi."},{"role":"assistant","content":"Hi, I am"}]`), "add_generation_prompt": false, "continue_final_message": true},
			template.Request{Messages: json.RawMessage(`[{"role":"user","content":"Say hi."},{"role":"assistant","content":"Hi, I am"}]`), AddGenerationPrompt: new(false), ContinueFinalMessage: true}},
	}
	for _, tc := range chats {
		t.Run("chat render "+tc.name, func(t *testing.T) {
			var got struct {
				TokenIDs []int `json:"token_ids"`
			}
			post(t, r.URL()+"/v1/chat/completions/render", tc.body, &got)
			if want := direct(t, tok, tmpl, tc.req); !slices.Equal(got.TokenIDs, want) {
				t.Errorf("token_ids = %v, want %v", got.TokenIDs, want)
			}
		})
	}
	t.Run("chat completion caches the direct ids", func(t *testing.T) {
		want := direct(t, tok, tmpl, template.Request{Messages: msgs})
		if len(want) < 2*bs {
			t.Fatalf("the chat is %d tokens, want at least 2 blocks for the test to mean anything", len(want))
		}
		for i, wantCached := range []int{0, (len(want) - 1) / bs * bs} {
			var u usageAnswer
			post(t, r.URL()+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 2}, &u)
			if u.Usage.PromptTokens != len(want) || u.Usage.PromptTokensDetails.CachedTokens != wantCached {
				t.Errorf("request %d: prompt_tokens %d, cached_tokens %d, want %d, %d",
					i+1, u.Usage.PromptTokens, u.Usage.PromptTokensDetails.CachedTokens, len(want), wantCached)
			}
		}
		if got := r.Contains(want, ""); got != len(want)/bs {
			t.Errorf("Contains(direct ids) = %d blocks, want %d", got, len(want)/bs)
		}
	})
}

// errorAnswer is vLLM's error body.
type errorAnswer struct {
	Error struct {
		Message string `json:"message"`
		Type    string `json:"type"`
		Code    int    `json:"code"`
	} `json:"error"`
}

func TestQwen3Refusals(t *testing.T) {
	tok, tmpl := qwen3Files(t)
	raising, err := template.Parse(`{{ raise_exception("This model only takes user turns.") }}`, nil, template.Options{})
	if err != nil {
		t.Fatal(err)
	}
	qwen := start(t, vllmtest.Config{Tokenizer: tok, ChatTemplate: tmpl, MaxModelLen: 64})
	raiser := start(t, vllmtest.Config{Tokenizer: tok, ChatTemplate: raising})
	user := json.RawMessage(`[{"role":"user","content":"hello"}]`)
	cases := []struct {
		name  string
		r     *vllmtest.Replica
		paths []string
		body  map[string]any
		want  string
		exact bool // the message is want verbatim, not merely containing it
	}{
		{"template raises", raiser, []string{"/v1/chat/completions", "/v1/chat/completions/render", "/tokenize"},
			map[string]any{"messages": user}, "This model only takes user turns.", true},
		{"both continue and generation prompt", qwen, []string{"/v1/chat/completions", "/v1/chat/completions/render"},
			map[string]any{"messages": user, "continue_final_message": true, "add_generation_prompt": true}, "Cannot set both `continue_final_message` and `add_generation_prompt` to True.", true},
		{"no messages", qwen, []string{"/v1/chat/completions", "/v1/chat/completions/render"},
			map[string]any{"model": "sim-model"}, "messages is required", false},
		{"too long", qwen, []string{"/v1/completions", "/v1/completions/render", "/tokenize"},
			map[string]any{"prompt": strings.Repeat("many words ", 100)}, "maximum context length is 64 tokens", false},
		{"empty prompt", qwen, []string{"/v1/completions", "/v1/completions/render"},
			map[string]any{"prompt": ""}, "The decoder prompt cannot be empty", false},
		{"negative max_tokens", qwen, []string{"/v1/completions", "/v1/completions/render"},
			map[string]any{"prompt": "hi", "max_tokens": -1}, "max_tokens must be at least 0", false},
	}
	for _, tc := range cases {
		for _, path := range tc.paths {
			t.Run(tc.name+" "+path, func(t *testing.T) {
				code, raw := postStatus(t, tc.r.URL()+path, tc.body)
				var got errorAnswer
				if err := json.Unmarshal(raw, &got); err != nil {
					t.Fatalf("decode %s: %v", raw, err)
				}
				if code != http.StatusBadRequest || got.Error.Code != 400 || got.Error.Type != "BadRequestError" || !strings.Contains(got.Error.Message, tc.want) || tc.exact && got.Error.Message != tc.want {
					t.Errorf("got %d %s, want 400 BadRequestError containing %q", code, raw, tc.want)
				}
			})
		}
	}
	t.Run("unknown model is 404 on render", func(t *testing.T) {
		if code, raw := postStatus(t, qwen.URL()+"/v1/completions/render", map[string]any{"model": "other", "prompt": "hi"}); code != http.StatusNotFound {
			t.Errorf("got %d %s, want 404", code, raw)
		}
	})
}
