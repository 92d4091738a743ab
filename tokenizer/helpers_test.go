package tokenizer_test

import (
	"bufio"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/internal/testfiles"
	"github.com/kvroute/kvroute/tokenizer"
)

// families are the tokenizer packages with golden fixtures.
var families = []string{"qwen3", "llama3_1", "gemma3", "deepseek_v3", "gptoss", "llama2"}

// loaded caches tokenizers across tests: Gemma 3's takes over a second.
var loaded sync.Map // family -> *tokenizer.Tokenizer

func load(tb testing.TB, family string) *tokenizer.Tokenizer {
	tb.Helper()
	if t, ok := loaded.Load(family); ok {
		return t.(*tokenizer.Tokenizer)
	}
	dir := testfiles.Tokenizer(tb, family)
	t, err := tokenizer.Load(dir)
	if err != nil {
		tb.Fatalf("Load(%s): %v", family, err)
	}
	loaded.Store(family, t)
	return t
}

// corpus reads testdata/corpus.jsonl.
func corpus(tb testing.TB) []string {
	tb.Helper()
	f, err := os.Open(filepath.Join("testdata", "corpus.jsonl"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	sc.Buffer(nil, 1<<24)
	for sc.Scan() {
		var s string
		if err := json.Unmarshal(sc.Bytes(), &s); err != nil {
			tb.Fatalf("corpus line %d: %v", len(out)+1, err)
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return out
}

type goldenHeader struct {
	Family     string `json:"family"`
	SHA256     string `json:"tokenizer_sha256"`
	Tokenizers string `json:"tokenizers"`
	Count      int    `json:"count"`
}

type goldenLine struct {
	I       int      `json:"i"`
	Plain   []uint32 `json:"plain"`
	Special []uint32 `json:"special"`
}

// golden reads testdata/golden/<family>.jsonl.gz and checks that it was
// made from the tokenizer file installed now.
func golden(tb testing.TB, family string) (goldenHeader, []goldenLine) {
	tb.Helper()
	f, err := os.Open(filepath.Join("testdata", "golden", family+".jsonl.gz"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		tb.Fatal(err)
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(nil, 1<<24)
	var h goldenHeader
	var lines []goldenLine
	for sc.Scan() {
		if h.Family == "" {
			if err := json.Unmarshal(sc.Bytes(), &h); err != nil {
				tb.Fatalf("golden %s header: %v", family, err)
			}
			continue
		}
		var l goldenLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			tb.Fatalf("golden %s line %d: %v", family, len(lines)+2, err)
		}
		lines = append(lines, l)
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	data, err := os.ReadFile(filepath.Join(testfiles.Tokenizer(tb, family), "tokenizer.json"))
	if err != nil {
		tb.Fatal(err)
	}
	sum := sha256.Sum256(data)
	if got := hex.EncodeToString(sum[:]); got != h.SHA256 {
		tb.Fatalf("golden %s was made from tokenizer.json sha256 %s, installed is %s: regenerate (testdata/README.md)", family, h.SHA256, got)
	}
	return h, lines
}

// diffIDs describes the first difference between two id lists, with a
// window of each around it, or returns "" when they are equal.
func diffIDs(got, want []uint32) string {
	n := min(len(got), len(want))
	i := 0
	for i < n && got[i] == want[i] {
		i++
	}
	if i == n && len(got) == len(want) {
		return ""
	}
	lo := max(0, i-3)
	window := func(s []uint32) []uint32 { return s[lo:min(len(s), i+5)] }
	return fmt.Sprintf("first difference at %d (len got %d, want %d): got [%d:] %v, want [%d:] %v",
		i, len(got), len(want), lo, window(got), lo, window(want))
}
