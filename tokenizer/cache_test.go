package tokenizer_test

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/tokenizer"
)

// specialCandidates are marker strings of all families; each family's
// test uses those its tokenizer knows as a token.
var specialCandidates = []string{
	"<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>", "<|eot_id|>",
	"<|start_header_id|>", "<|end_header_id|>", "<start_of_turn>", "<end_of_turn>", "<bos>",
	"<eos>", "<｜begin▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>", "<|start|>", "<|message|>",
	"<|end|>", "<s>", "</s>", "<think>", "</think>", "\n", "\n\n",
}

// cacheInputs returns the corpus followed by n seeded random
// concatenations of corpus strings with the family's special tokens
// between and inside them, the shape of chat traffic.
func cacheInputs(tb testing.TB, tok *tokenizer.Tokenizer, n int) []string {
	tb.Helper()
	texts := corpus(tb)
	var specials []string
	for _, s := range specialCandidates {
		if _, ok := tok.TokenID(s); ok {
			specials = append(specials, s)
		}
	}
	if len(specials) == 0 {
		tb.Fatal("no special tokens known to the tokenizer")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	out := slices.Clone(texts)
	for range n {
		var b strings.Builder
		for range 2 + rng.IntN(7) {
			if rng.IntN(3) > 0 {
				b.WriteString(specials[rng.IntN(len(specials))])
			}
			b.WriteString(texts[rng.IntN(len(texts))])
		}
		out = append(out, b.String())
	}
	return out
}

// TestCacheEqualsEncode is the cache's property: through a Cache, cold
// or warm, large or evicting, every input encodes as Tokenizer.Encode
// does.
func TestCacheEqualsEncode(t *testing.T) {
	for _, family := range families {
		t.Run(family, func(t *testing.T) {
			tok := load(t, family)
			inputs := cacheInputs(t, tok, 400)
			want := make([][2][]uint32, len(inputs))
			for i, s := range inputs {
				for j, special := range []bool{false, true} {
					ids, err := tok.Encode(s, special)
					if err != nil {
						t.Fatal(err)
					}
					want[i][j] = ids
				}
			}
			for _, budget := range []int64{64 << 20, 32 << 10} {
				t.Run(fmt.Sprintf("budget=%d", budget), func(t *testing.T) {
					c := tokenizer.NewCache(tok, budget)
					for pass := range 2 {
						for i, s := range inputs {
							for j, special := range []bool{false, true} {
								got, err := c.Encode(s, special)
								if err != nil {
									t.Fatal(err)
								}
								if d := diffIDs(got, want[i][j]); d != "" {
									t.Fatalf("pass %d, input %d %q, addSpecialTokens=%v: cached %s", pass, i, s, special, d)
								}
							}
						}
					}
					st := c.Stats()
					if st.Hits == 0 {
						t.Errorf("Stats().Hits = 0 after encoding everything twice, want > 0")
					}
					if st.Bytes > budget {
						t.Errorf("Stats().Bytes = %d, want <= budget %d", st.Bytes, budget)
					}
					if budget < 1<<20 && st.Evictions == 0 {
						t.Errorf("Stats().Evictions = 0 with a %d-byte budget, want > 0", budget)
					}
				})
			}
		})
	}
}

// metaspaceFirst is a tiny tokenizer whose Metaspace pre-tokenizer
// prepends "▁" only to the piece that starts the input, so the same
// segment text encodes differently first and later.
const metaspaceFirst = `{
  "added_tokens": [{"id": 6, "content": "<x>", "single_word": false, "lstrip": false,
    "rstrip": false, "normalized": false, "special": true}],
  "normalizer": null,
  "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": false},
  "post_processor": null,
  "decoder": null,
  "model": {"type": "BPE", "dropout": null, "unk_token": "<unk>", "fuse_unk": true, "byte_fallback": false,
    "vocab": {"▁": 0, "a": 1, "b": 2, "▁a": 3, "ab": 4, "▁ab": 5, "<x>": 6, "<unk>": 7},
    "merges": ["▁ a", "a b", "▁a b"]}
}`

// TestCacheFirstSegment checks that a segment's position is part of the
// key: under prepend_scheme "first" the opening segment gains a "▁".
func TestCacheFirstSegment(t *testing.T) {
	tok, err := tokenizer.FromJSON([]byte(metaspaceFirst))
	if err != nil {
		t.Fatal(err)
	}
	seg := strings.Repeat("ab", 8)
	c := tokenizer.NewCache(tok, 1<<20)
	for _, text := range []string{seg + "<x>" + seg, seg, "<x>" + seg, seg + "<x>" + seg} {
		want, _ := tok.Encode(text, false)
		got, _ := c.Encode(text, false)
		if !slices.Equal(got, want) {
			t.Errorf("Encode(%q): cached %v, want %v", text, got, want)
		}
	}
	first, _ := tok.Encode(seg, false)
	later, _ := tok.Encode("<x>"+seg, false)
	if slices.Equal(first, later[1:]) {
		t.Fatalf("the fixture does not distinguish first segments: %v and %v", first, later)
	}
}

// TestCacheConversation checks that turn N of a conversation misses only
// on its new segments.
func TestCacheConversation(t *testing.T) {
	tok := load(t, "qwen3")
	c := tokenizer.NewCache(tok, 64<<20)
	turns := conversation(20, 2000)
	for i := range turns {
		before := c.Stats()
		text := strings.Join(turns[:i+1], "")
		got, err := c.Encode(text, false)
		if err != nil {
			t.Fatal(err)
		}
		want, _ := tok.Encode(text, false)
		if d := diffIDs(got, want); d != "" {
			t.Fatalf("turn %d: %s", i+1, d)
		}
		after := c.Stats()
		if i > 0 {
			if misses := after.Misses - before.Misses; misses > 2 {
				t.Errorf("turn %d: %d misses, want at most 2 (the new message's segments)", i+1, misses)
			}
		}
	}
}

// conversation renders a Qwen3 chat: a system prompt of about
// systemWords words, then turns alternating user and assistant messages.
// Each element is one rendered message.
func conversation(turns, systemWords int) []string {
	rng := rand.New(rand.NewPCG(7, 8))
	words := strings.Fields("the router keeps a map of which replica holds which prefix blocks and " +
		"sends each request where most of its prompt is already cached so that prefill is skipped " +
		"function return error value cache token model GPU 42 3.14 déjà vu 你好 世界 😀")
	text := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(" \n"[min(1, rng.IntN(12)/11)])
			}
			b.WriteString(words[rng.IntN(len(words))])
		}
		return b.String()
	}
	out := []string{"<|im_start|>system\n" + text(systemWords) + "<|im_end|>\n"}
	for i := 1; i < turns; i++ {
		role := "user"
		if i%2 == 0 {
			role = "assistant"
		}
		out = append(out, "<|im_start|>"+role+"\n"+text(40+rng.IntN(200))+"<|im_end|>\n")
	}
	return out
}
