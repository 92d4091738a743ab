package tokenizer_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

// benchText is the text both BenchmarkEncode and gen/bench_hf.js encode:
// the corpus joined by newlines.
func benchText(tb testing.TB) string {
	tb.Helper()
	return strings.Join(corpus(tb), "\n")
}

// BenchmarkEncode measures cold throughput, with no segment Cache: the
// number to compare with Hugging Face's (node tokenizer/testdata/gen/bench_hf.js).
func BenchmarkEncode(b *testing.B) {
	for _, family := range []string{"qwen3", "llama3_1", "gemma3"} {
		b.Run(family, func(b *testing.B) {
			tok := load(b, family)
			text := benchText(b)
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := tok.Encode(text, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEncodeProse is BenchmarkEncode on plain prose and Markdown
// (testdata/prose.txt; node tokenizer/testdata/gen/bench_hf.js --prose
// measures Hugging Face on the same file), so that the comparison is not
// made only on the corpus, which is hostile by design.
func BenchmarkEncodeProse(b *testing.B) {
	raw, err := os.ReadFile(filepath.Join("testdata", "prose.txt"))
	if err != nil {
		b.Fatal(err)
	}
	text := string(raw)
	for _, family := range []string{"qwen3", "llama3_1", "gemma3"} {
		b.Run(family, func(b *testing.B) {
			tok := load(b, family)
			b.SetBytes(int64(len(text)))
			b.ResetTimer()
			for b.Loop() {
				if _, err := tok.Encode(text, true); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkEncodeTurn20 encodes turn 20 of a 20-message Qwen3 chat whose
// system prompt is about 8k tokens: uncached, and through a Cache warmed
// by turns 1 to 19, as a router sees the conversation.
func BenchmarkEncodeTurn20(b *testing.B) {
	tok := load(b, "qwen3")
	turns := conversation(20, 6200)
	sys, _ := tok.Encode(turns[0], false)
	full := strings.Join(turns, "")
	ids, _ := tok.Encode(full, false)
	b.Run("uncached", func(b *testing.B) {
		for b.Loop() {
			if _, err := tok.Encode(full, false); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(sys)), "system-tokens")
		b.ReportMetric(float64(len(ids)), "tokens")
	})
	b.Run("cached", func(b *testing.B) {
		var c *tokenizer.Cache
		for b.Loop() {
			// Warm with turns 1..19 outside the timer, then time turn 20,
			// whose last message is new to the cache.
			b.StopTimer()
			c = tokenizer.NewCache(tok, 64<<20)
			for i := 1; i < len(turns); i++ {
				c.Encode(strings.Join(turns[:i], ""), false)
			}
			b.StartTimer()
			if _, err := c.Encode(full, false); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(len(sys)), "system-tokens")
		b.ReportMetric(float64(len(ids)), "tokens")
	})
}
