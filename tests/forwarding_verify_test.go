package tests_test

import (
	"compress/gzip"
	"encoding/json"
	"io/fs"
	"net/http"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/kvroute/kvroute/internal/app"
	kvprompt "github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/tokenizer/qwen3"
)

// oneMergeApart is Qwen3's tokenizer files with one BPE merge removed
// ("Ġth" + "e", so " the" becomes two tokens): a tokenizer.json from
// another revision of the model, as an operator could mount by mistake.
func oneMergeApart(t *testing.T) fs.FS {
	t.Helper()
	f, err := qwen3.FS.Open("tokenizer.json.gz")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	var tok map[string]json.RawMessage
	if err := json.NewDecoder(zr).Decode(&tok); err != nil {
		t.Fatal(err)
	}
	var model map[string]json.RawMessage
	if err := json.Unmarshal(tok["model"], &model); err != nil {
		t.Fatal(err)
	}
	var merges [][2]string
	if err := json.Unmarshal(model["merges"], &merges); err != nil {
		t.Fatal(err)
	}
	kept := merges[:0]
	for _, m := range merges {
		if m != [2]string{"Ġth", "e"} {
			kept = append(kept, m)
		}
	}
	if len(kept) != len(merges)-1 {
		t.Fatalf("removed %d merges, want exactly one", len(merges)-len(kept))
	}
	model["merges"], _ = json.Marshal(kept)
	tok["model"], _ = json.Marshal(model)
	raw, _ := json.Marshal(tok)
	cfg, err := fs.ReadFile(qwen3.FS, "tokenizer_config.json")
	if err != nil {
		t.Fatal(err)
	}
	return fstest.MapFS{"tokenizer.json": {Data: raw}, "tokenizer_config.json": {Data: cfg}}
}

// TestTokenForwardingVerified: a completion's text prompt is forwarded as
// kvroute's ids only once the model's local tokenizer has agreed with a
// replica's /tokenize (finding 6 of issue 23: any local file was trusted).
// With the replica's own files, forwarding turns on after the checks;
// with a tokenizer one merge apart it never does: every request reaches
// the replica as text, so the replica counts the prompt as its own
// tokenizer does, and the mismatch is counted.
func TestTokenForwardingVerified(t *testing.T) {
	prose := strings.Repeat("the router keeps the blocks of the prompt near the engine that holds them. ", 6)
	for _, tt := range []struct {
		name  string
		files fs.FS
		state string // kvroute_token_forwarding once checked
	}{
		{"the replica's own files", qwen3.FS, "1"},
		{"one merge apart", oneMergeApart(t), "-1"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := newFrontDoor(t, app.Tokenizers{FS: map[string]fs.FS{model: tt.files}}, 1)
			var rep interface{ Tokenize(string) []int }
			for _, r := range f.reps {
				rep = r
			}
			want := len(rep.Tokenize(prose))
			complete := func(i int) {
				t.Helper()
				body, _ := json.Marshal(map[string]any{"model": model, "prompt": prose, "max_tokens": 1})
				code, raw := f.call(http.MethodPost, "/v1/completions", string(body))
				var c struct {
					Usage struct {
						Prompt int `json:"prompt_tokens"`
					} `json:"usage"`
				}
				if code != http.StatusOK || json.Unmarshal([]byte(raw), &c) != nil {
					t.Fatalf("completion %d: %d %s", i, code, raw)
				}
				if c.Usage.Prompt != want {
					t.Errorf("completion %d: the replica saw %d prompt tokens, want %d, its own tokenization of the text", i, c.Usage.Prompt, want)
				}
			}
			for i := range kvprompt.DefaultVerifyMatches {
				complete(i)
			}
			series := `kvroute_token_forwarding{model="` + model + `"} ` + tt.state
			f.waitFor(series, func() bool {
				_, m := f.call(http.MethodGet, "/metrics", "")
				return strings.Contains(m, series+"\n")
			})
			for i := range 3 {
				complete(kvprompt.DefaultVerifyMatches + i)
			}
			_, m := f.call(http.MethodGet, "/metrics", "")
			if tt.state == "-1" && !strings.Contains(m, `kvroute_token_forwarding_checks_total{model="`+model+`",result="mismatch"}`) {
				t.Errorf("no mismatch counted:\n%s", grepLines(m, "kvroute_token_forwarding"))
			}
		})
	}
}
