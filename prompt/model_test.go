package prompt_test

import (
	"context"
	"encoding/json"
	"os"
	"slices"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/testfiles"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/tokenizer"
	"github.com/kvroute/kvroute/tokenizer/qwen3"
	"github.com/kvroute/kvroute/tokenizer/template"
)

// TestQwen3 resolves prompts through the Qwen3 files shipped in the
// binary, and checks them against the same files loaded the long way.
func TestQwen3(t *testing.T) {
	m, err := prompt.LoadModel(qwen3.FS, ".", 0, template.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if m.Template == nil {
		t.Fatal("Qwen3's files define a chat template; LoadModel found none")
	}
	r, err := prompt.New(prompt.Config{Models: map[string]*prompt.Model{"qwen": m}})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Run("text", func(t *testing.T) {
		s := "Hello, world!"
		got, err := r.Resolve(ctx, prompt.Input{Request: kvroute.TokenizeRequest{Model: "qwen", Prompt: &s}})
		if err != nil {
			t.Fatal(err)
		}
		if want := []uint32{9707, 11, 1879, 0}; !slices.Equal(got.Tokens, want) || got.Source != prompt.SourceLocal {
			t.Errorf("got %v from %s, want %v from local", got.Tokens, got.Source, want)
		}
	})
	t.Run("chat equals template then tokenizer", func(t *testing.T) {
		msgs := json.RawMessage(`[{"role":"system","content":"You are terse."},{"role":"user","content":"Hi there"}]`)
		got, err := r.Resolve(ctx, prompt.Input{Request: kvroute.TokenizeRequest{Model: "qwen", Messages: msgs}})
		if err != nil {
			t.Fatal(err)
		}
		dir := testfiles.Tokenizer(t, "qwen3")
		tmpl, err := template.Load(dir, template.Options{})
		if err != nil {
			t.Fatal(err)
		}
		out, err := tmpl.Render(template.Request{Messages: msgs})
		if err != nil {
			t.Fatal(err)
		}
		tok, err := tokenizer.Load(dir)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := tok.Encode(out.Prompt, false)
		if !slices.Equal(got.Tokens, want) {
			t.Errorf("got %d tokens, want %d; first difference at %d", len(got.Tokens), len(want), prompt.FirstDifference(got.Tokens, want))
		}
	})
	t.Run("no template in the folder", func(t *testing.T) {
		dir := t.TempDir()
		raw, err := qwen3.FS.ReadFile("tokenizer.json.gz")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dir+"/tokenizer.json.gz", raw, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(dir+"/tokenizer_config.json", []byte(`{"bos_token": null}`), 0o644); err != nil {
			t.Fatal(err)
		}
		m, err := prompt.LoadModel(os.DirFS(dir), ".", -1, template.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if m.Template != nil {
			t.Error("a folder with no chat template gave a template")
		}
	})
}
