package tokenizer_test

import (
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

// TestScannerEqualsRegexp2 checks the hand-written scanners against
// regexp2 on the corpus, the corpus joined into one text, and some
// hand-picked whitespace and contraction cases.
func TestScannerEqualsRegexp2(t *testing.T) {
	texts := corpus(t)
	texts = append(texts, strings.Join(texts, "\n"),
		"a  \n\n  b", " \t\n", "x \u3000\u3000y", "'S'LL'Re 'x", "\r\n\r\n  ", "  !!\r\n", "12345 ١٢٣٤",
		"\u00a0\u00a0a", "a\u0085b", " \n ", "\t!", " !", "  !")
	for _, p := range tokenizer.ScannerPatterns() {
		t.Run(p, func(t *testing.T) {
			for _, s := range texts {
				fast, slow, err := tokenizer.CompareScanner(p, s)
				if err != nil {
					t.Fatal(err)
				}
				if !slices.Equal(fast, slow) {
					t.Fatalf("%q: scanner %v, regexp2 %v", s, fast, slow)
				}
			}
		})
	}
}

func FuzzScanner(f *testing.F) {
	for _, s := range corpus(f)[:300] {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, p := range tokenizer.ScannerPatterns() {
			fast, slow, err := tokenizer.CompareScanner(p, s)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(fast, slow) {
				t.Fatalf("pattern %s, %q: scanner %v, regexp2 %v", p, s, fast, slow)
			}
		}
	})
}
