package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/testfiles"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenizer/qwen3"
)

// qwen3Dir writes the shipped Qwen3 files to a folder, as a user's
// tokenizer folder would hold them.
func qwen3Dir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"tokenizer.json.gz", "tokenizer_config.json"} {
		raw, err := qwen3.FS.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), raw, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func TestTokenize(t *testing.T) {
	dir := qwen3Dir(t)
	for _, tc := range []struct {
		name  string
		args  []string
		stdin string
		want  string
	}{
		{"text argument", []string{"--tokenizer", dir, "Hello, world!"}, "", "[9707,11,1879,0]\n"},
		{"text on stdin", []string{"--tokenizer", dir}, "Hello, world!", "[9707,11,1879,0]\n"},
		{"chat", []string{"--tokenizer", dir, "--chat"}, `{"messages":[{"role":"user","content":"hi"}]}`, "[151644,872,198,6023,151645,198,151644,77091,198]\n"},
		{"chat without the generation prompt", []string{"--tokenizer", dir, "--chat"}, `{"messages":[{"role":"user","content":"hi"}],"add_generation_prompt":false}`, "[151644,872,198,6023,151645,198]\n"},
		{"jsonl", []string{"--tokenizer", dir, "--jsonl"}, "\"Hello, world!\"\n\"\"\nnot json\n", "[9707,11,1879,0]\n[]\n{\"error\":\"each line must be a JSON string: invalid character 'o' in literal null (expecting 'u')\"}\n"},
		{"jsonl chat", []string{"--tokenizer", dir, "--jsonl", "--chat"}, `{"messages":[{"role":"user","content":"hi"}]}` + "\n{}\n", "[151644,872,198,6023,151645,198,151644,77091,198]\n{\"error\":\"chat body: messages is required\"}\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if err := runTokenize(context.Background(), tc.args, strings.NewReader(tc.stdin), &out, &errOut); err != nil {
				t.Fatalf("err = %v (stderr %s)", err, errOut.String())
			}
			if got := out.String(); got != tc.want {
				t.Errorf("stdout = %q, want %q", got, tc.want)
			}
		})
	}
	t.Run("usage errors", func(t *testing.T) {
		for _, args := range [][]string{{}, {"--tokenizer", dir, "--jsonl", "x"}, {"--tokenizer", dir, "a", "b"}} {
			var out, errOut bytes.Buffer
			if code := run(context.Background(), append([]string{"tokenize"}, args...), &out, &errOut); code != 2 {
				t.Errorf("%v: exit %d, want 2 (stderr %s)", args, code, errOut.String())
			}
		}
	})
}

// TestTokenizeIsTheRouters: the command's ids are the ones serve's front
// door keys, for a text prompt and a chat, with Llama 3.1's files (whose
// tokenizer adds a BOS to text, the case an off-by-default flag got
// wrong); the flag turns the router's choice around. /v1/route's
// prompt_tokens agrees on the length, through the HTTP handler.
func TestTokenizeIsTheRouters(t *testing.T) {
	dir := testfiles.Tokenizer(t, "llama3_1")
	a, err := app.New(context.Background(), app.Config{Router: router.DefaultConfig(),
		Tokenizers: app.Tokenizers{Dirs: map[string]string{"m": dir}, NoRemote: true}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop() })
	if err := a.Store.PutReplica(context.Background(), kvroute.Replica{ID: "r", Model: "m", URL: "http://127.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(a.API)
	defer srv.Close()
	const chat = `{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hello"}]}`
	text := "hello, router"
	no := false
	for _, tc := range []struct {
		name  string
		args  []string
		input string
		req   kvroute.TokenizeRequest
		route string // the /v1/route body, empty to skip
	}{
		{"text", nil, text, kvroute.TokenizeRequest{Prompt: &text}, `{"model":"m","prompt":"hello, router"}`},
		{"text without special tokens", []string{"--add-special-tokens=false"}, text,
			kvroute.TokenizeRequest{Prompt: &text, AddSpecialTokens: &no}, ""},
		{"chat", []string{"--chat"}, chat, kvroute.TokenizeRequest{Messages: json.RawMessage(
			`[{"role":"system","content":"Be brief."},{"role":"user","content":"hello"}]`)},
			`{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"hello"}]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var out, errOut bytes.Buffer
			if err := runTokenize(context.Background(), append([]string{"--tokenizer", dir}, append(tc.args, tc.input)...),
				strings.NewReader(""), &out, &errOut); err != nil {
				t.Fatalf("err = %v (stderr %s)", err, errOut.String())
			}
			var got []uint32
			if err := json.Unmarshal(out.Bytes(), &got); err != nil {
				t.Fatalf("stdout %q: %v", out.String(), err)
			}
			tc.req.Model = "m"
			res, err := a.Prompts.Resolve(context.Background(), prompt.Input{Request: tc.req})
			if err != nil || res.Source != prompt.SourceLocal {
				t.Fatalf("router: %+v, %v", res, err)
			}
			if !slices.Equal(got, res.Tokens) {
				t.Errorf("command ids %v, router keys %v", got, res.Tokens)
			}
			if bos := 128000; tc.name == "text" && (len(got) == 0 || got[0] != uint32(bos)) {
				t.Errorf("text ids %v do not start with BOS %d, as the router's (and vLLM's) default adds it", got, bos)
			}
			if tc.route == "" {
				return
			}
			status, raw := post(t, srv.URL+"/v1/route", tc.route)
			var d struct {
				PromptTokens int    `json:"prompt_tokens"`
				Tokenization string `json:"tokenization"`
			}
			if err := json.Unmarshal([]byte(raw), &d); status != http.StatusOK || err != nil {
				t.Fatalf("route: %d %s %v", status, raw, err)
			}
			if d.Tokenization != "local" || d.PromptTokens != len(got) {
				t.Errorf("route: %s tokenization, %d prompt tokens; the command printed %d", d.Tokenization, d.PromptTokens, len(got))
			}
		})
	}
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(raw)
}
