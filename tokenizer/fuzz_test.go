package tokenizer_test

import (
	"slices"
	"testing"
	"unicode/utf8"

	"github.com/kvroute/kvroute/tokenizer"
)

// FuzzCache checks, on arbitrary text, that Encode does not fail or panic
// and that a Cache answers exactly as Encode, cold and warm.
func FuzzCache(f *testing.F) {
	for _, s := range corpus(f)[:200] {
		f.Add(s)
	}
	toks := []*tokenizer.Tokenizer{load(f, "qwen3"), load(f, "llama2")}
	caches := []*tokenizer.Cache{tokenizer.NewCache(toks[0], 1<<20), tokenizer.NewCache(toks[1], 1<<20)}
	f.Fuzz(func(t *testing.T, s string) {
		if !utf8.ValidString(s) {
			return
		}
		for i, tok := range toks {
			want, err := tok.Encode(s, true)
			if err != nil {
				t.Fatal(err)
			}
			for range 2 {
				got, err := caches[i].Encode(s, true)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(got, want) {
					t.Fatalf("Encode(%q): cached %v, want %v", s, got, want)
				}
			}
		}
	})
}
