package tokenizer_test

import (
	"testing"
)

// TestParity encodes the whole corpus with every family's tokenizer and
// requires exactly the ids Hugging Face's Rust tokenizer gave, with and
// without special tokens. One differing id fails it.
func TestParity(t *testing.T) {
	texts := corpus(t)
	for _, family := range families {
		t.Run(family, func(t *testing.T) {
			h, lines := golden(t, family)
			if h.Count != len(texts) || len(lines) != len(texts) {
				t.Fatalf("golden has %d lines (header says %d), corpus has %d strings: regenerate", len(lines), h.Count, len(texts))
			}
			tok := load(t, family)
			bad := 0
			for _, l := range lines {
				for _, c := range []struct {
					special bool
					want    []uint32
				}{{false, l.Plain}, {true, l.Special}} {
					got, err := tok.Encode(texts[l.I], c.special)
					if err != nil {
						t.Fatalf("Encode(%q, %v): %v", texts[l.I], c.special, err)
					}
					if d := diffIDs(got, c.want); d != "" {
						bad++
						if bad <= 10 {
							t.Errorf("string %d %q, addSpecialTokens=%v: %s", l.I, texts[l.I], c.special, d)
						}
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d encodings differ from Hugging Face", bad, 2*len(lines))
			}
		})
	}
}
