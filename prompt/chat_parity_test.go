package prompt_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/testfiles"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/tokenizer/template"
)

// chatGolden is one line of tokenizer/template/testdata/golden: a chat
// request body, and the prompt and token ids vLLM's pipeline gives it
// (jinja2 with transformers' environment, Hugging Face's Rust tokenizer),
// or the error it raises. See that folder's README for provenance.
type chatGolden struct {
	Name string `json:"name"`
	Body struct {
		Messages             json.RawMessage `json:"messages"`
		Tools                json.RawMessage `json:"tools"`
		Documents            json.RawMessage `json:"documents"`
		ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
		AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
		ContinueFinalMessage bool            `json:"continue_final_message"`
	} `json:"body"`
	IDs   []uint32 `json:"ids"`
	Error string   `json:"error"`
}

// TestChatTokenParity runs every chat golden through the front door as
// the router keys a chat (vLLM's message normalization, the model's
// template, the model's tokenizer with add_special_tokens false) and
// requires the exact token ids Hugging Face's pipeline produced: one
// differing token and every block key after it misses.
func TestChatTokenParity(t *testing.T) {
	// render.py pins strftime_now to this instant (Llama 3.1 prints the
	// date).
	fixed := time.Date(2025, 3, 14, 15, 9, 26, 0, time.Local)
	for _, family := range []string{"qwen3", "llama3_1", "gemma3", "deepseek_v3"} {
		t.Run(family, func(t *testing.T) {
			dir := testfiles.Tokenizer(t, family)
			m, err := prompt.LoadModel(os.DirFS(dir), ".", 0, template.Options{Now: func() time.Time { return fixed }})
			if err != nil {
				t.Fatal(err)
			}
			r, err := prompt.New(prompt.Config{Models: map[string]*prompt.Model{family: m}})
			if err != nil {
				t.Fatal(err)
			}
			f, err := os.Open(filepath.Join(testfiles.Root(), "tokenizer", "template", "testdata", "golden", family+".jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			sc := bufio.NewScanner(f)
			sc.Buffer(make([]byte, 1<<20), 16<<20)
			matched, refused := 0, 0
			for sc.Scan() {
				var g chatGolden
				if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
					t.Fatal(err)
				}
				b := g.Body
				res, err := r.Resolve(context.Background(), prompt.Input{Request: kvroute.TokenizeRequest{
					Model: family, Messages: b.Messages, Tools: b.Tools, Documents: b.Documents,
					ChatTemplateKwargs: b.ChatTemplateKwargs, AddGenerationPrompt: b.AddGenerationPrompt,
					ContinueFinalMessage: b.ContinueFinalMessage,
				}})
				if g.Error != "" {
					if !errors.Is(err, kvroute.ErrInvalidInput) {
						t.Errorf("%s: got %v, want the request refused (%s)", g.Name, err, g.Error)
					}
					refused++
					continue
				}
				if err != nil {
					t.Errorf("%s: %v", g.Name, err)
					continue
				}
				if res.Partial != "" {
					// Multimodal goldens: only the text before the first
					// media part is keyed; it must be a prefix.
					if len(res.Tokens) > len(g.IDs) || !slices.Equal(res.Tokens, g.IDs[:len(res.Tokens)]) {
						t.Errorf("%s: the keyed prefix (%d tokens) is not a prefix of the engine's ids", g.Name, len(res.Tokens))
					}
					matched++
					continue
				}
				if at := prompt.FirstDifference(res.Tokens, g.IDs); at >= 0 {
					t.Errorf("%s: tokens differ from the engine's at %d (got %d tokens, want %d)", g.Name, at, len(res.Tokens), len(g.IDs))
					continue
				}
				matched++
			}
			if err := sc.Err(); err != nil {
				t.Fatal(err)
			}
			t.Logf("%s: %d conversations token-identical, %d refused as vLLM refuses them", family, matched, refused)
			if family != "deepseek_v3" && matched < 25 {
				t.Errorf("only %d conversations checked, want at least 25", matched)
			}
		})
	}
}
