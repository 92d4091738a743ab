package tokenizer_test

import (
	"slices"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

// TestConcurrentEncode shares one Tokenizer and one small Cache between
// goroutines (run under -race) and checks every result.
func TestConcurrentEncode(t *testing.T) {
	tok := load(t, "qwen3")
	texts := cacheInputs(t, tok, 100)
	want := make([][]uint32, len(texts))
	for i, s := range texts {
		want[i], _ = tok.Encode(s, true)
	}
	c := tokenizer.NewCache(tok, 256<<10)
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range texts {
				j := (i*7 + g*13) % len(texts)
				got, err := tok.Encode(texts[j], true)
				if err != nil || !slices.Equal(got, want[j]) {
					t.Errorf("goroutine %d: Encode(%q) = %v, %v", g, texts[j], got, err)
					return
				}
				got, err = c.Encode(texts[j], true)
				if err != nil || !slices.Equal(got, want[j]) {
					t.Errorf("goroutine %d: cached Encode(%q) = %v, %v", g, texts[j], got, err)
					return
				}
			}
		}()
	}
	wg.Wait()
}
