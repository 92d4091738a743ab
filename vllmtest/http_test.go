package vllmtest_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/vllmtest"
)

// post sends a JSON request and decodes the JSON answer into out.
func post(tb testing.TB, url string, body any, out any) {
	tb.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("POST %s: %s: %s", url, resp.Status, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			tb.Fatalf("decode %s: %v", raw, err)
		}
	}
}

type tokenizeAnswer struct {
	Count       int   `json:"count"`
	MaxModelLen int   `json:"max_model_len"`
	Tokens      []int `json:"tokens"`
	TokenStrs   any   `json:"token_strs"`
}

type usageAnswer struct {
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
}

func TestTokenize(t *testing.T) {
	r := start(t, vllmtest.Config{BlockSize: 4})
	t.Run("text", func(t *testing.T) {
		text := "The same prompt, tokenized twice."
		var tok tokenizeAnswer
		post(t, r.URL()+"/tokenize", map[string]any{"model": "sim-model", "prompt": text, "add_special_tokens": true}, &tok)
		if !reflect.DeepEqual(tok.Tokens, r.Tokenize(text)) || tok.Count != len(tok.Tokens) || tok.MaxModelLen == 0 {
			t.Errorf("/tokenize = %+v, want tokens %v", tok, r.Tokenize(text))
		}
		var u usageAnswer
		post(t, r.URL()+"/v1/completions", map[string]any{"prompt": text, "max_tokens": 3}, &u)
		if u.Usage.PromptTokens != tok.Count || u.Usage.CompletionTokens != 3 || len(u.Choices[0].Text) != 3 {
			t.Errorf("usage %+v text %q, want %d prompt and 3 completion tokens", u.Usage, u.Choices[0].Text, tok.Count)
		}
		if got, want := r.Contains(tok.Tokens, ""), tok.Count/4; got != want {
			t.Errorf("Contains(/tokenize ids) = %d, want %d: the completion cached other ids", got, want)
		}
	})
	t.Run("chat", func(t *testing.T) {
		msgs := []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}}
		var tok tokenizeAnswer
		post(t, r.URL()+"/tokenize", map[string]any{"model": "sim-model", "messages": msgs, "add_generation_prompt": true, "add_special_tokens": false}, &tok)
		var u usageAnswer
		post(t, r.URL()+"/v1/chat/completions", map[string]any{"messages": msgs, "max_completion_tokens": 2}, &u)
		if u.Usage.PromptTokens != tok.Count || u.Choices[0].Message.Content == "" {
			t.Errorf("chat prompt_tokens %d content %q, want %d", u.Usage.PromptTokens, u.Choices[0].Message.Content, tok.Count)
		}
		if got, want := r.Contains(tok.Tokens, ""), tok.Count/4; got != want {
			t.Errorf("Contains(/tokenize chat ids) = %d, want %d", got, want)
		}
	})
}

func TestCachedTokens(t *testing.T) {
	r := start(t, vllmtest.Config{BlockSize: 16})
	prompt := strings.Repeat("a long shared system prompt. ", 4) // 116 bytes + BOS = 117 tokens
	ask := func(body map[string]any) usageAnswer {
		t.Helper()
		var u usageAnswer
		post(t, r.URL()+"/v1/completions", body, &u)
		return u
	}
	cases := []struct {
		name string
		body map[string]any
		want int
	}{
		{"cold", map[string]any{"prompt": prompt}, 0},
		{"warm", map[string]any{"prompt": prompt}, 112},
		{"longer prompt shares the prefix", map[string]any{"prompt": prompt + "and more"}, 112},
		{"other salt", map[string]any{"prompt": prompt, "cache_salt": "tenant-b"}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ask(tc.body).Usage.PromptTokensDetails.CachedTokens; got != tc.want {
				t.Errorf("cached_tokens = %d, want %d", got, tc.want)
			}
		})
	}
	t.Run("stream with usage", func(t *testing.T) {
		b, _ := json.Marshal(map[string]any{"prompt": prompt, "stream": true, "max_tokens": 4, "stream_options": map[string]any{"include_usage": true}})
		resp, err := http.Post(r.URL()+"/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		chunks := strings.Split(strings.TrimSpace(string(raw)), "\n\n")
		if len(chunks) != 6 || chunks[5] != "data: [DONE]" {
			t.Fatalf("got %d chunks %q, want 4 tokens, usage, [DONE]", len(chunks), chunks)
		}
		var u usageAnswer
		if err := json.Unmarshal([]byte(strings.TrimPrefix(chunks[4], "data: ")), &u); err != nil {
			t.Fatal(err)
		}
		if u.Usage.PromptTokensDetails.CachedTokens != 112 || u.Usage.CompletionTokens != 4 {
			t.Errorf("stream usage %+v, want 112 cached, 4 completion", u.Usage)
		}
	})
}

// TestCachedTokensLastTokenRecomputed checks vLLM v1's rule: the prompt's
// last token is always computed (its logits sample the first output
// token), so a hit never covers it and at most floor((n-1)/bs) blocks are
// served from the cache.
func TestCachedTokensLastTokenRecomputed(t *testing.T) {
	const bs, k = 16, 3
	cases := []struct {
		name   string
		prompt []int
		want   int
	}{
		{"exactly k full blocks serves k-1", seqTokens(1, k*bs), (k - 1) * bs},
		{"k blocks and one token serves k", seqTokens(1000, k*bs+1), k * bs},
		{"one full block serves none", seqTokens(2000, bs), 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := start(t, vllmtest.Config{BlockSize: bs})
			for i, want := range []int{0, tc.want} {
				var u usageAnswer
				post(t, r.URL()+"/v1/completions", map[string]any{"prompt": tc.prompt, "max_tokens": 1}, &u)
				if got := u.Usage.PromptTokensDetails.CachedTokens; got != want {
					t.Errorf("request %d: cached_tokens = %d, want %d", i+1, got, want)
				}
			}
			if got, want := r.Contains(tc.prompt, ""), len(tc.prompt)/bs; got != want {
				t.Errorf("Contains = %d blocks, want %d: every full block is still cached", got, want)
			}
		})
	}
}

func TestChatStream(t *testing.T) {
	r := start(t, vllmtest.Config{})
	b, _ := json.Marshal(map[string]any{"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "text", "text": "hi"}}}}, "stream": true, "max_tokens": 3})
	resp, err := http.Post(r.URL()+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type = %q, want text/event-stream", ct)
	}
	raw, _ := io.ReadAll(resp.Body)
	chunks := strings.Split(strings.TrimSpace(string(raw)), "\n\n")
	if len(chunks) != 5 || chunks[4] != "data: [DONE]" {
		t.Fatalf("got %q, want role chunk, 3 tokens, [DONE]", chunks)
	}
	var text strings.Builder
	for i, c := range chunks[:4] {
		var ch struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta        map[string]any `json:"delta"`
				FinishReason *string        `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(c, "data: ")), &ch); err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if ch.Object != "chat.completion.chunk" || len(ch.Choices) != 1 {
			t.Fatalf("chunk %d = %s", i, c)
		}
		if i == 0 && ch.Choices[0].Delta["role"] != "assistant" {
			t.Errorf("first delta %v, want role assistant", ch.Choices[0].Delta)
		}
		if s, ok := ch.Choices[0].Delta["content"].(string); ok {
			text.WriteString(s)
		}
		if (i == 3) != (ch.Choices[0].FinishReason != nil) {
			t.Errorf("chunk %d finish_reason %v, want it only on the last", i, ch.Choices[0].FinishReason)
		}
	}
	if text.Len() != 3 {
		t.Errorf("streamed %q, want 3 bytes (max_tokens 3)", text.String())
	}
}

func TestHealthMetricsDie(t *testing.T) {
	r := start(t, vllmtest.Config{Model: "m1", BlockSize: 8})
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(r.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	t.Run("health", func(t *testing.T) {
		if code, _ := get("/health"); code != 200 {
			t.Errorf("healthy /health = %d, want 200", code)
		}
		r.SetHealthy(false)
		if code, _ := get("/health"); code != 503 {
			t.Errorf("unhealthy /health = %d, want 503", code)
		}
		r.SetHealthy(true)
	})
	t.Run("metrics", func(t *testing.T) {
		mustAdmit(t, r, seqTokens(1, 20), "", 0)
		mustAdmit(t, r, seqTokens(1, 20), "", 16)
		_, body := get("/metrics")
		for _, want := range []string{
			`vllm:num_requests_running{engine="0",model_name="m1"} 0`,
			`vllm:num_requests_waiting{engine="0",model_name="m1"} 0`,
			`vllm:prefix_cache_queries_total{engine="0",model_name="m1"} 40`,
			`vllm:prefix_cache_hits_total{engine="0",model_name="m1"} 16`,
			`vllm:kv_cache_usage_perc{engine="0",model_name="m1"} `,
			`vllm:cache_config_info{block_size="8",`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %q:\n%s", want, body)
			}
		}
	})
	t.Run("die", func(t *testing.T) {
		r.Die()
		if _, err := http.Get(r.URL() + "/health"); err == nil {
			t.Error("GET /health after Die succeeded, want an error")
		}
	})
}

func TestRunningCount(t *testing.T) {
	r := start(t, vllmtest.Config{MaxRunning: 1, PrefillTokensPerSec: 100})
	done := make(chan struct{}, 2)
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			b, _ := json.Marshal(map[string]any{"prompt": seqTokens(1, 30), "max_tokens": 1})
			resp, err := http.Post(r.URL()+"/v1/completions", "application/json", bytes.NewReader(b))
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	wait.UntilNil(t, "1 running and 1 waiting", func() error {
		resp, err := http.Get(r.URL() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), `vllm:num_requests_running{engine="0",model_name="sim-model"} 1`) &&
			strings.Contains(string(b), `vllm:num_requests_waiting{engine="0",model_name="sim-model"} 1`) {
			return nil
		}
		return fmt.Errorf("the metrics:\n%s", b)
	})
	<-done
	<-done
}
