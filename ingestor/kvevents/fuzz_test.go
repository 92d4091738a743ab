package kvevents_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/ingestor/internal/wire"
	"github.com/kvroute/kvroute/ingestor/kvevents"
)

var update = flag.Bool("update", false, "rewrite testdata fixtures")

// goldenV026 is the batch VLLM_EVENTS.md §2 shows as captured from vLLM
// v0.26.0 (tokens 1..16; the spec elides them), encoded the way msgspec
// does: map events in field order, compact integers, 0xcf for the hash.
func goldenV026(tb testing.TB) []byte {
	tb.Helper()
	ev := wire.OMap{
		{"type", "BlockStored"}, {"block_hashes", []any{wire.U64(big)}}, {"parent_block_hash", nil},
		{"token_ids", wire.Tokens(1, 16)}, {"block_size", 16}, {"lora_id", nil}, {"medium", "GPU"},
		{"lora_name", nil}, {"extra_keys", []any{nil}}, {"group_idx", 0}, {"kv_cache_spec_kind", "full_attention"},
	}
	return wire.Encode(tb, []any{1789095808.83, []any{ev}, 0})
}

func TestDecodeGoldenV026(t *testing.T) {
	path := filepath.Join("testdata", "v0.26.0_batch.msgpack")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, goldenV026(t), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	payload, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read fixture (run go test -run Golden -update): %v", err)
	}
	if !bytes.Equal(payload, goldenV026(t)) {
		t.Errorf("fixture differs from its generator; rerun with -update if intended")
	}
	b, err := kvevents.Decode([][]byte{[]byte("kv"), wire.Seq8(0), payload})
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	want := []kvevents.Event{{
		Kind: kvevents.BlockStored, BlockHashes: []uint64{big}, TokenIDs: wire.UTokens(1, 16), BlockSize: 16,
		Medium: "GPU", ExtraKeys: [][]kvevents.ExtraKey{nil}, HasGroup: true, SpecKind: "full_attention",
	}}
	if !reflect.DeepEqual(b.Events, want) {
		t.Errorf("events:\n got %+v\nwant %+v", b.Events, want)
	}
	if b.TS != 1789095808.83 || b.DPRank == nil || *b.DPRank != 0 {
		t.Errorf("got ts %v rank %v, want ts 1789095808.83 rank 0", b.TS, b.DPRank)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte("kv"), wire.Seq8(1), goldenV026(f))
	f.Add([]byte(""), wire.Seq8(0), wire.Encode(f, []any{1.0, []any{wire.Stored([]any{1, wire.U64(big)}, 3, wire.Tokens(0, 8), 4, 1, "CPU", "a", []any{[]any{"a", []any{"i", 1}}, nil})}}))
	f.Add([]byte("x"), wire.Seq8(2), wire.Encode(f, wire.OMap{{"ts", 1}, {"events", []any{wire.OMap{{"type", "BlockRemoved"}, {"block_hashes", []any{[]byte("12345678")}}}}}}))
	f.Add([]byte("x"), []byte{1, 2}, []byte{0x93})
	f.Fuzz(func(t *testing.T, topic, seq, payload []byte) {
		b, err := kvevents.Decode([][]byte{topic, seq, payload})
		if err != nil {
			if len(b.Events) != 0 {
				t.Fatalf("rejected message produced %d events", len(b.Events))
			}
			return
		}
		for _, ev := range b.Events {
			if ev.Kind == kvevents.BlockStored && len(ev.TokenIDs) > 0 && len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
				t.Fatalf("accepted event with %d tokens for %d blocks of %d", len(ev.TokenIDs), len(ev.BlockHashes), ev.BlockSize)
			}
		}
		// Translation of anything accepted must not panic either.
		tr := ingestor.NewTranslator("m", "r", 0, nil)
		if _, _, err := tr.Translate(t.Context(), b.Events); err != nil {
			t.Fatalf("Translate: %v", err)
		}
	})
}
