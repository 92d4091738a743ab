package tokenizer_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/tokenizer"
)

// TestLongRun guards against quadratic merging: 100 KB of one character
// is a single word for Gemma 3 (no pre-tokenizer split) and one long
// whitespace or letter run for the byte-level families.
func TestLongRun(t *testing.T) {
	for _, family := range []string{"qwen3", "llama3_1", "gemma3", "llama2"} {
		for _, ch := range []string{"a", " ", "\n", "é", "😀"} {
			t.Run(family+"/"+ch, func(t *testing.T) {
				tok := load(t, family)
				text := strings.Repeat(ch, 100_000/len(ch))
				start := time.Now()
				ids, err := tok.Encode(text, false)
				if err != nil {
					t.Fatal(err)
				}
				if took := time.Since(start); took > 2*time.Second {
					t.Errorf("Encode of 100 KB of %q took %v, want < 2s", ch, took)
				}
				if len(ids) == 0 {
					t.Errorf("Encode returned no ids")
				}
			})
		}
	}
}

func TestEncodeInvalidUTF8(t *testing.T) {
	tok := load(t, "qwen3")
	if _, err := tok.Encode("a\xffb", false); !errors.Is(err, tokenizer.ErrInvalidUTF8) {
		t.Errorf("Encode(invalid UTF-8) error = %v, want ErrInvalidUTF8", err)
	}
}

func TestTokenID(t *testing.T) {
	tok := load(t, "qwen3")
	for _, c := range []struct {
		s    string
		want uint32
		ok   bool
	}{
		{"<|im_start|>", 151644, true},
		{"Hello", 9707, true},
		{"not a token at all", 0, false},
	} {
		t.Run(c.s, func(t *testing.T) {
			got, ok := tok.TokenID(c.s)
			if got != c.want || ok != c.ok {
				t.Errorf("TokenID(%q) = %d, %v, want %d, %v", c.s, got, ok, c.want, c.ok)
			}
		})
	}
	if got, want := tok.VocabSize(), 151669; got != want {
		t.Errorf("VocabSize() = %d, want %d", got, want)
	}
}

// TestDecodeRoundTrip decodes every corpus encoding of the byte-level
// families back to its text (Qwen3's NFC aside, their encoding is
// lossless).
func TestDecodeRoundTrip(t *testing.T) {
	for _, family := range []string{"qwen3", "llama3_1", "gptoss", "deepseek_v3"} {
		t.Run(family, func(t *testing.T) {
			tok := load(t, family)
			for _, s := range corpus(t) {
				ids, _ := tok.Encode(s, false)
				got := tok.Decode(ids)
				if family == "qwen3" {
					continue // NFC changes text; Encode(Decode) is checked below
				}
				if got != s {
					t.Fatalf("Decode(Encode(%q)) = %q", s, got)
				}
			}
			for _, s := range corpus(t) {
				ids, _ := tok.Encode(s, false)
				again, _ := tok.Encode(tok.Decode(ids), false)
				if !slices.Equal(again, ids) {
					t.Fatalf("Encode(Decode(Encode(%q))) = %v, want %v", s, again, ids)
				}
			}
		})
	}
}

func TestLoadGzip(t *testing.T) {
	tok, err := tokenizer.Load("qwen3") // holds tokenizer.json.gz only
	if err != nil {
		t.Fatal(err)
	}
	if got, want := tok.VocabSize(), 151669; got != want {
		t.Errorf("VocabSize() = %d, want %d", got, want)
	}
}

// TestLoadErrors checks that unsupported components fail to load, naming
// themselves, instead of being approximated.
func TestLoadErrors(t *testing.T) {
	base := func(repl map[string]string) string {
		parts := map[string]string{
			"normalizer":     "null",
			"pre_tokenizer":  "null",
			"post_processor": "null",
			"decoder":        "null",
			"model":          `{"type": "BPE", "dropout": null, "vocab": {"a": 0}, "merges": []}`,
			"truncation":     "null",
		}
		for k, v := range repl {
			parts[k] = v
		}
		var b strings.Builder
		b.WriteString(`{"added_tokens": []`)
		for _, k := range []string{"normalizer", "pre_tokenizer", "post_processor", "decoder", "model", "truncation"} {
			b.WriteString(`, "` + k + `": ` + parts[k])
		}
		b.WriteString("}")
		return b.String()
	}
	for _, c := range []struct {
		name string
		repl map[string]string
		want string
	}{
		{"unigram", map[string]string{"model": `{"type": "Unigram", "vocab": []}`}, `"Unigram"`},
		{"dropout", map[string]string{"model": `{"type": "BPE", "dropout": 0.1, "vocab": {}, "merges": []}`}, "dropout"},
		{"precompiled", map[string]string{"normalizer": `{"type": "Precompiled", "precompiled_charsmap": ""}`}, `"Precompiled"`},
		{"bert normalizer in sequence", map[string]string{"normalizer": `{"type": "Sequence", "normalizers": [{"type": "BertNormalizer"}]}`}, `"BertNormalizer"`},
		{"unicode scripts", map[string]string{"pre_tokenizer": `{"type": "UnicodeScripts"}`}, `"UnicodeScripts"`},
		{"bad behavior", map[string]string{"pre_tokenizer": `{"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways"}`}, `"Sideways"`},
		{"wordpiece decoder", map[string]string{"decoder": `{"type": "WordPiece"}`}, `"WordPiece"`},
		{"truncation", map[string]string{"truncation": `{"max_length": 10}`}, "truncation"},
		{"merge out of vocab", map[string]string{"model": `{"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}`}, `"b"`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := tokenizer.FromJSON([]byte(base(c.repl)))
			if err == nil || !strings.Contains(err.Error(), c.want) || !strings.HasPrefix(err.Error(), "tokenizer: load: ") {
				t.Errorf("FromJSON error = %v, want one starting %q and naming %s", err, "tokenizer: load: ", c.want)
			}
		})
	}
}
