package qwen3_test

import (
	"slices"
	"testing"

	"github.com/kvroute/kvroute/internal/testfiles"
	"github.com/kvroute/kvroute/tokenizer"
	"github.com/kvroute/kvroute/tokenizer/qwen3"
)

func TestLoad(t *testing.T) {
	tok, err := qwen3.Load()
	if err != nil {
		t.Fatal(err)
	}
	t.Run("hello", func(t *testing.T) {
		got, err := tok.Encode("Hello, world!", true)
		if err != nil {
			t.Fatal(err)
		}
		if want := []uint32{9707, 11, 1879, 0}; !slices.Equal(got, want) {
			t.Errorf("Encode = %v, want %v", got, want)
		}
	})
	t.Run("same as installed", func(t *testing.T) {
		// The embedded file must be the one the goldens were made from.
		installed, err := tokenizer.Load(testfiles.Tokenizer(t, "qwen3"))
		if err != nil {
			t.Fatal(err)
		}
		text := "<|im_start|>user\n你好 😀 x := 42<|im_end|>"
		got, _ := tok.Encode(text, true)
		want, _ := installed.Encode(text, true)
		if !slices.Equal(got, want) {
			t.Errorf("embedded %v, installed %v", got, want)
		}
	})
}
