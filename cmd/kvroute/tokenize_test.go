package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

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
