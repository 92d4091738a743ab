package vllmtest_test

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/vllmtest"
)

func TestEvents(t *testing.T) {
	for _, enc := range []string{vllmtest.EncodingArray, vllmtest.EncodingMap} {
		t.Run(enc, func(t *testing.T) {
			r := start(t, vllmtest.Config{EventEncoding: enc, Topic: "kv", HashSeed: "0", CapacityBlocks: 4})
			sub := subscribe(t, r)
			h, _ := vllmtest.EngineHashes("0", 16, seqTokens(1, 48), "", "")

			// Two full blocks and a partial one: only full blocks are stored.
			post(t, r.URL()+"/v1/completions", map[string]any{"prompt": seqTokens(1, 40), "max_tokens": 2}, nil)
			b := live(t, sub)
			if b.topic != "kv" || b.seq != 0 {
				t.Errorf("topic, seq = %q, %d, want kv, 0", b.topic, b.seq)
			}
			if _, ok := b.ts.(float64); !ok {
				t.Errorf("ts is %T, want float64", b.ts)
			}
			if u64(t, b.rank) != 0 {
				t.Errorf("data_parallel_rank = %v, want 0", b.rank)
			}
			if len(b.evs) != 1 {
				t.Fatalf("got %d events, want 1", len(b.evs))
			}
			s := asStored(t, enc, b.evs[0])
			if want := vectors["0"]; !reflect.DeepEqual(s.hashes, want) {
				t.Errorf("block_hashes = %v, want %v (the §4 test vector)", s.hashes, want)
			}
			if s.parent != nil {
				t.Errorf("parent_block_hash = %d, want nil", *s.parent)
			}
			if want := u64sOf(seqTokens(1, 32)); !reflect.DeepEqual(s.tokens, want) {
				t.Errorf("token_ids = %v, want %v", s.tokens, want)
			}
			if s.blockSize != 16 || s.medium != "GPU" || s.loraName != nil {
				t.Errorf("block_size, medium, lora_name = %d, %v, %v, want 16, GPU, nil", s.blockSize, s.medium, s.loraName)
			}
			if enc == vllmtest.EncodingMap {
				m := b.evs[0].(map[string]any)
				if !reflect.DeepEqual(m["extra_keys"], []any{nil, nil}) || m["kv_cache_spec_kind"] != "full_attention" || u64(t, m["group_idx"]) != 0 {
					t.Errorf("extra_keys, group_idx, kind = %v, %v, %v, want [nil nil], 0, full_attention", m["extra_keys"], m["group_idx"], m["kv_cache_spec_kind"])
				}
			} else if raw := b.evs[0].([]any); len(raw) != 8 {
				t.Errorf("BlockStored array has %d elements, want 8", len(raw))
			}

			// The cached prefix is not stored again: the next batch carries
			// only block 2, chained to block 1.
			post(t, r.URL()+"/v1/completions", map[string]any{"prompt": seqTokens(1, 48), "max_tokens": 1}, nil)
			b = live(t, sub)
			s = asStored(t, enc, b.evs[0])
			if b.seq != 1 || !reflect.DeepEqual(s.hashes, h[2:3]) || s.parent == nil || *s.parent != h[1] {
				t.Errorf("seq %d hashes %v parent %v, want 1 %v %d", b.seq, s.hashes, s.parent, h[2:3], h[1])
			}
			if want := u64sOf(seqTokens(33, 16)); !reflect.DeepEqual(s.tokens, want) {
				t.Errorf("token_ids = %v, want %v", s.tokens, want)
			}

			// Capacity 4 holds 3; two new blocks evict one, the old prompt's
			// tail (block 2), before they are stored.
			post(t, r.URL()+"/v1/completions", map[string]any{"prompt": seqTokens(100, 32), "max_tokens": 1}, nil)
			b = live(t, sub)
			if len(b.evs) != 2 {
				t.Fatalf("got %d events, want BlockRemoved then BlockStored", len(b.evs))
			}
			if got := asRemoved(t, enc, b.evs[0]); !reflect.DeepEqual(got, h[2:3]) {
				t.Errorf("removed %v, want %v", got, h[2:3])
			}
			if s := asStored(t, enc, b.evs[1]); len(s.hashes) != 2 || s.parent != nil {
				t.Errorf("stored %v parent %v, want 2 blocks from the start", s.hashes, s.parent)
			}
			if got := r.CachedBlocks(); got != 4 {
				t.Errorf("CachedBlocks = %d, want 4", got)
			}
			if got := r.Contains(seqTokens(1, 48), ""); got != 2 {
				t.Errorf("Contains(old prompt) = %d, want 2", got)
			}

			r.ClearCache()
			b = live(t, sub)
			if typ, _ := normalize(t, enc, b.evs[0]); typ != "AllBlocksCleared" || b.seq != 3 {
				t.Errorf("got %s seq %d, want AllBlocksCleared seq 3", typ, b.seq)
			}
			if got := r.CachedBlocks(); got != 0 {
				t.Errorf("CachedBlocks after ClearCache = %d, want 0", got)
			}
		})
	}
}

func TestEventsExtraKeys(t *testing.T) {
	r := start(t, vllmtest.Config{EventEncoding: vllmtest.EncodingMap, LoRAs: []string{"ad"}, BlockSize: 4})
	sub := subscribe(t, r)
	post(t, r.URL()+"/v1/completions", map[string]any{"model": "ad", "prompt": seqTokens(1, 8), "cache_salt": "s1", "max_tokens": 1}, nil)
	b := live(t, sub)
	m := b.evs[0].(map[string]any)
	want := []any{[]any{"ad", "s1"}, []any{"ad"}}
	if !reflect.DeepEqual(m["extra_keys"], want) || m["lora_name"] != "ad" || u64(t, m["lora_id"]) != 1 {
		t.Errorf("extra_keys, lora_name, lora_id = %v, %v, %v; want %v, ad, 1", m["extra_keys"], m["lora_name"], m["lora_id"], want)
	}
	h, _ := vllmtest.EngineHashes(vllmtest.DefaultHashSeed, 4, seqTokens(1, 8), "ad", "s1")
	if got := u64s(t, m["block_hashes"]); !reflect.DeepEqual(got, h) {
		t.Errorf("block_hashes = %v, want %v", got, h)
	}
}

// TestBigHashEncoding checks that a hash >= 2^63 travels as msgpack uint64
// (0xcf), the form a Python publisher uses and decoders must accept.
func TestBigHashEncoding(t *testing.T) {
	r := start(t, vllmtest.Config{BlockSize: 1, CapacityBlocks: 64})
	var toks []int
	var big uint64
	for tok := 1; tok < 64 && big == 0; tok++ {
		toks = []int{tok}
		h, err := r.BlockHashes(toks, "")
		if err != nil {
			t.Fatal(err)
		}
		if h[0] >= 1<<63 {
			big = h[0]
		}
	}
	if big == 0 {
		t.Fatal("no single-token block hashed to >= 2^63")
	}
	sub := subscribe(t, r)
	mustAdmit(t, r, toks, "", 0)
	b := live(t, sub)
	want := append([]byte{0xcf}, be8(big)...)
	if !bytes.Contains(b.raw, want) {
		t.Errorf("payload %x lacks %x", b.raw, want)
	}
}

// TestTokenEncoding checks the hand-written token lists against the
// msgpack encoder's own shortest forms, at every width boundary.
func TestTokenEncoding(t *testing.T) {
	toks := []int{0, 1, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<63 - 1}
	var want bytes.Buffer
	enc := msgpack.NewEncoder(&want)
	if err := enc.EncodeArrayLen(len(toks)); err != nil {
		t.Fatal(err)
	}
	for _, v := range toks {
		if err := enc.EncodeUint(uint64(v)); err != nil {
			t.Fatal(err)
		}
	}
	if got := vllmtest.EncodeTokens(toks); !bytes.Equal(got, want.Bytes()) {
		t.Errorf("token list encoding:\n got %x\nwant %x", got, want.Bytes())
	}
}
