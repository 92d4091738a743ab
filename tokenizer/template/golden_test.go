package template_test

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testfiles"
	"github.com/kvroute/kvroute/tokenizer/template"
)

// fixedNow is the instant render.py pins strftime_now to.
var fixedNow = time.Date(2025, 3, 14, 15, 9, 26, 0, time.Local)

func pinnedClock() time.Time { return fixedNow }

// golden is one line of testdata/golden/*.jsonl.
type golden struct {
	Name   string          `json:"name"`
	Body   json.RawMessage `json:"body"`
	Prompt *string         `json:"prompt"`
	Error  *string         `json:"error"`
	IDs    []int           `json:"ids"`
}

// body is the part of a chat request the goldens carry.
type body struct {
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	Documents            json.RawMessage `json:"documents"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	ReasoningEffort      string          `json:"reasoning_effort"`
	Kwargs               json.RawMessage `json:"chat_template_kwargs"`
}

func (b body) request() template.Request {
	return template.Request{
		Messages:             b.Messages,
		Tools:                b.Tools,
		Documents:            b.Documents,
		AddGenerationPrompt:  b.AddGenerationPrompt,
		ContinueFinalMessage: b.ContinueFinalMessage,
		ReasoningEffort:      b.ReasoningEffort,
		Kwargs:               b.Kwargs,
	}
}

func readGoldens(tb testing.TB, name string) []golden {
	tb.Helper()
	f, err := os.Open(filepath.Join("testdata", "golden", name+".jsonl"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out []golden
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 16<<20)
	for sc.Scan() {
		var g golden
		if err := json.Unmarshal(sc.Bytes(), &g); err != nil {
			tb.Fatalf("%s.jsonl line %d: %v", name, len(out)+1, err)
		}
		out = append(out, g)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

// loadFamily loads the template a golden file was rendered with.
func loadFamily(tb testing.TB, name string) *template.Template {
	tb.Helper()
	opt := template.Options{Now: pinnedClock}
	var dir string
	switch name {
	case "qwen3_committed":
		dir = filepath.Join("testdata", "qwen3")
	case "llama3_1_json":
		src, err := os.ReadFile(filepath.Join("testdata", "templates", "tool_chat_template_llama3.1_json.jinja"))
		if err != nil {
			tb.Fatal(err)
		}
		opt.ChatTemplate = string(src)
		dir = testfiles.Tokenizer(tb, "llama3_1")
	default:
		dir = testfiles.Tokenizer(tb, name)
	}
	tmpl, err := template.Load(dir, opt)
	if err != nil {
		tb.Fatal(err)
	}
	return tmpl
}

func TestGoldens(t *testing.T) {
	for _, family := range []struct{ name, goldens string }{
		{"qwen3_committed", "qwen3"},
		{"qwen3", "qwen3"},
		{"llama3_1", "llama3_1"},
		{"gemma3", "gemma3"},
		{"deepseek_v3", "deepseek_v3"},
		{"llama3_1_json", "llama3_1_json"},
	} {
		t.Run(family.name, func(t *testing.T) {
			tmpl := loadFamily(t, family.name)
			for _, g := range readGoldens(t, family.goldens) {
				t.Run(g.Name, func(t *testing.T) {
					checkGolden(t, tmpl, g)
				})
			}
		})
	}
}

func checkGolden(t *testing.T, tmpl *template.Template, g golden) {
	t.Helper()
	var b body
	dec := json.NewDecoder(bytes.NewReader(g.Body))
	if err := dec.Decode(&b); err != nil {
		t.Fatalf("body: %v", err)
	}
	got, err := tmpl.Render(b.request())
	if g.Error != nil {
		var re *template.RequestError
		if !errors.As(err, &re) {
			t.Fatalf("Render: got err %v (prompt %q), want request error %q", err, got.Prompt, *g.Error)
		}
		if re.Msg != *g.Error {
			t.Fatalf("Render: got error %q, want %q", re.Msg, *g.Error)
		}
		return
	}
	if err != nil {
		t.Fatalf("Render: %v", err)
	}
	if got.Prompt != *g.Prompt {
		t.Fatalf("prompt differs from golden: %s", diff(got.Prompt, *g.Prompt))
	}
	hasMedia := strings.Contains(string(g.Body), `"image_url"`)
	if !hasMedia && got.TextPrefix != len(got.Prompt) {
		t.Errorf("TextPrefix: got %d, want len(Prompt) %d", got.TextPrefix, len(got.Prompt))
	}
	if hasMedia && (got.TextPrefix <= 0 || got.TextPrefix >= len(got.Prompt)) {
		t.Errorf("TextPrefix: got %d, want within (0, %d)", got.TextPrefix, len(got.Prompt))
	}
}

// diff describes where got first departs from want, with context.
func diff(got, want string) string {
	i := 0
	for i < len(got) && i < len(want) && got[i] == want[i] {
		i++
	}
	lo := max(0, i-40)
	return fmt.Sprintf("first difference at byte %d (len got %d, want %d)\n got: %q\nwant: %q",
		i, len(got), len(want), got[lo:min(len(got), i+60)], want[lo:min(len(want), i+60)])
}

// TestFeatureGoldens renders golden/features.jsonl: one synthetic template
// per Jinja feature, each with its request.
func TestFeatureGoldens(t *testing.T) {
	specials := map[string]string{"bos_token": "<s>", "eos_token": "</s>"}
	f, err := os.ReadFile(filepath.Join("testdata", "golden", "features.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range bytes.Split(bytes.TrimSpace(f), []byte("\n")) {
		var g struct {
			golden
			Template string `json:"template"`
		}
		if err := json.Unmarshal(line, &g); err != nil {
			t.Fatal(err)
		}
		t.Run(g.Name, func(t *testing.T) {
			tmpl, err := template.Parse(g.Template, specials, template.Options{Now: pinnedClock})
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			checkGolden(t, tmpl, g.golden)
		})
	}
}
