package vllmtest_test

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/fxamacker/cbor/v2"

	"github.com/kvroute/kvroute/vllmtest"
)

// Test vectors from shared/VLLM_EVENTS.md §4: sha256_cbor, tokens 1..32,
// block size 16, no extra keys.
var vectors = map[string][]uint64{
	"vllm-none-hash": {8866452693264111234, 807986237951177663},
	"0":              {3236607068019569386, 2758186210834249151},
}

func TestEngineHashes(t *testing.T) {
	for seed, want := range vectors {
		t.Run("seed="+seed, func(t *testing.T) {
			got, err := vllmtest.EngineHashes(seed, 16, seqTokens(1, 32), "", "")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("EngineHashes = %v, want %v", got, want)
			}
		})
	}
	t.Run("partial block is not hashed", func(t *testing.T) {
		got, err := vllmtest.EngineHashes("0", 16, seqTokens(1, 47), "", "")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[1] != vectors["0"][1] {
			t.Errorf("EngineHashes(47 tokens) = %v, want 2 blocks ending in %d", got, vectors["0"][1])
		}
	})
	t.Run("cache salt changes every block, lora too", func(t *testing.T) {
		plain, _ := vllmtest.EngineHashes("0", 16, seqTokens(1, 32), "", "")
		salted, _ := vllmtest.EngineHashes("0", 16, seqTokens(1, 32), "", "s1")
		lora, _ := vllmtest.EngineHashes("0", 16, seqTokens(1, 32), "ad", "")
		for i := range plain {
			if salted[i] == plain[i] || lora[i] == plain[i] || lora[i] == salted[i] {
				t.Errorf("block %d: plain %d salted %d lora %d should all differ", i, plain[i], salted[i], lora[i])
			}
		}
	})
}

// TestBlockEncoding checks the hand-written encoding of a block without
// extra keys against the CBOR library's canonical encoding, across every
// integer width boundary a token id or a block length can cross.
func TestBlockEncoding(t *testing.T) {
	em, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		t.Fatal(err)
	}
	var parent vllmtest.Digest
	for i := range parent {
		parent[i] = byte(i * 7)
	}
	edges := []int{0, 1, 23, 24, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<63 - 1}
	for _, tt := range []struct {
		name   string
		tokens []int
	}{
		{"empty", nil},
		{"one", []int{5}},
		{"edges", edges},
		{"23 tokens", make([]int, 23)},
		{"24 tokens", make([]int, 24)},
		{"256 tokens", make([]int, 256)},
		{"mixed", append(make([]int, 300), edges...)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			toks := make([]uint64, len(tt.tokens))
			for i, v := range tt.tokens {
				toks[i] = uint64(v)
			}
			want, err := em.Marshal([]any{parent[:], toks, nil})
			if err != nil {
				t.Fatal(err)
			}
			if got := vllmtest.AppendBlock(nil, parent, tt.tokens); !bytes.Equal(got, want) {
				t.Errorf("encoding differs from the library's:\n got %x\nwant %x", got, want)
			}
		})
	}
}
