package kvevents_test

import (
	"bytes"
	"reflect"
	"testing"

	"github.com/kvroute/kvroute/ingestor/internal/wire"
	"github.com/kvroute/kvroute/ingestor/kvevents"
)

const big = uint64(15760518052499183552) // >= 2^63: msgpack 0xcf

func TestDecode(t *testing.T) {
	h32 := bytes.Repeat([]byte{0xaa}, 24)
	h32 = append(h32, 0, 0, 0, 0, 0, 0, 0x01, 0x02) // sha256: last 8 bytes
	h16 := append(bytes.Repeat([]byte{0xbb}, 8), 0, 0, 0, 0, 0, 0, 0x03, 0x04)
	base := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{1}, TokenIDs: wire.UTokens(1, 4), BlockSize: 4}
	with := func(f func(*kvevents.Event)) kvevents.Event {
		e := base
		f(&e)
		return e
	}
	rank0 := 0
	tests := []struct {
		name        string
		frames      [][]byte
		wantReason  string // whole-message rejection
		wantEvents  []kvevents.Event
		wantSkipped map[string]int
		wantTS      float64
		wantRank    *int
	}{
		{
			name:       "array batch, 3 elements, minimal BlockStored",
			frames:     wire.Msg(t, "kv", 7, []any{1.5, []any{wire.Stored([]any{1}, nil, wire.Tokens(1, 4), 4)}, 0}),
			wantEvents: []kvevents.Event{base},
			wantTS:     1.5,
			wantRank:   &rank0,
		},
		{
			name:       "array batch, 2 elements (very old)",
			frames:     wire.Msg(t, "kv", 7, []any{1.5, []any{wire.Stored([]any{1}, nil, wire.Tokens(1, 4), 4)}}),
			wantEvents: []kvevents.Event{base},
			wantTS:     1.5,
		},
		{
			name: "map batch",
			frames: wire.Msg(t, "kv", 7, wire.OMap{{"ts", 1.5}, {"events", []any{wire.Stored([]any{1}, nil, wire.Tokens(1, 4), 4)}},
				{"data_parallel_rank", 0}, {"future", "ignored"}}),
			wantEvents: []kvevents.Event{base},
			wantTS:     1.5,
			wantRank:   &rank0,
		},
		{
			name:       "float32 ts and nil rank",
			frames:     wire.Msg(t, "kv", 7, []any{wire.F32(2.5), []any{}, nil}),
			wantEvents: nil,
			wantTS:     2.5,
		},
		{
			name: "hash widths: fixint, uint8, uint16, uint32, uint64 >= 2^63, int64",
			frames: wire.Msg(t, "kv", 1, []any{0.0, []any{
				[]any{"BlockRemoved", []any{5, wire.U8(200), wire.U16(60000), wire.U32(4000000000), wire.U64(big), wire.I64(-1)}},
			}}),
			wantEvents: []kvevents.Event{{Kind: kvevents.BlockRemoved,
				BlockHashes: []uint64{5, 200, 60000, 4000000000, big, 1<<64 - 1}}},
		},
		{
			name: "token widths: fixint, uint8, uint16, uint32, uint64, integral float",
			frames: wire.Msg(t, "kv", 1, []any{0.0, []any{
				wire.Stored([]any{1}, nil, []any{5, wire.U8(200), wire.U16(60000), wire.U32(4000000000), wire.U64(7), 3.0}, 6),
			}}),
			wantEvents: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{1},
				TokenIDs: []uint32{5, 200, 60000, 4000000000, 7, 3}, BlockSize: 6}},
		},
		{
			name: "token ids beyond uint32 or negative are malformed",
			frames: wire.Msg(t, "kv", 1, []any{0.0, []any{
				wire.Stored([]any{1}, nil, []any{1, 2, 3, wire.U64(1 << 32)}, 4),
				wire.Stored([]any{1}, nil, []any{1, 2, 3, wire.I64(-4)}, 4),
				wire.Stored([]any{1}, nil, []any{1, 2, 3, wire.U64(big)}, 4),
			}}),
			wantSkipped: map[string]int{kvevents.SkipMalformed: 3},
		},
		{
			name: "bytes hashes: 32-byte sha256 and 16-byte xxhash, last 8 bytes big-endian",
			frames: wire.Msg(t, "kv", 1, []any{0.0, []any{
				wire.Stored([]any{h32, h16}, h16, wire.Tokens(0, 2), 1),
			}}),
			wantEvents: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{0x0102, 0x0304},
				HasParent: true, Parent: 0x0304, TokenIDs: wire.UTokens(0, 2), BlockSize: 1}},
		},
		{
			name:       "parent as uint64",
			frames:     wire.Msg(t, "kv", 1, []any{0.0, []any{wire.Stored([]any{1}, wire.U64(big), wire.Tokens(1, 4), 4)}}),
			wantEvents: []kvevents.Event{with(func(e *kvevents.Event) { e.HasParent, e.Parent = true, big })},
		},
		{
			name: "all positional fields",
			frames: wire.Msg(t, "kv", 1, []any{0.0, []any{wire.Stored([]any{1}, nil, wire.Tokens(1, 4), 4,
				3, "CPU", "ad1", []any{[]any{"ad1", "salt"}}, 0, "full_attention", nil)}}),
			wantEvents: []kvevents.Event{with(func(e *kvevents.Event) {
				e.HasLoRAID, e.LoRAID, e.Medium, e.LoRAName = true, 3, "CPU", "ad1"
				e.ExtraKeys = [][]kvevents.ExtraKey{{{Kind: kvevents.ExtraString, Str: "ad1"}, {Kind: kvevents.ExtraString, Str: "salt"}}}
				e.HasGroup, e.SpecKind = true, "full_attention"
			})},
		},
		{
			name: "token-less offload event",
			frames: wire.Msg(t, "kv", 1, []any{0.0, []any{
				wire.Stored([]any{1, 2}, nil, []any{}, 0, nil, "CPU"),
			}}),
			wantEvents: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{}, Medium: "CPU"}},
		},
		{
			name: "extra_keys: nil, strings, pairs, bytes, ints",
			frames: wire.Msg(t, "kv", 1, []any{0.0, []any{wire.Stored([]any{1, 2, 3}, nil, wire.Tokens(0, 3), 1, nil, nil, nil,
				[]any{nil, []any{"mmhash", []any{"img1", 5}}, []any{[]byte{1, 2}, 7}})}}),
			wantEvents: []kvevents.Event{{Kind: kvevents.BlockStored, BlockHashes: []uint64{1, 2, 3}, TokenIDs: wire.UTokens(0, 3), BlockSize: 1,
				ExtraKeys: [][]kvevents.ExtraKey{nil,
					{{Kind: kvevents.ExtraString, Str: "mmhash"}, {Kind: kvevents.ExtraPair, Str: "img1", Int: 5}},
					{{Kind: kvevents.ExtraBytes, Str: "\x01\x02"}, {Kind: kvevents.ExtraInt, Int: 7}}}}},
		},
		{
			name: "map events, both types, unknown key ignored, defaults omitted",
			frames: wire.Msg(t, "kv", 1, []any{0.0, []any{
				wire.OMap{{"type", "BlockStored"}, {"block_hashes", []any{1}}, {"parent_block_hash", nil}, {"token_ids", wire.Tokens(1, 4)},
					{"block_size", 4}, {"lora_id", nil}, {"medium", nil}, {"lora_name", nil}, {"new_field", []any{1, 2}}},
				wire.OMap{{"type", "BlockRemoved"}, {"block_hashes", []any{1}}, {"medium", "GPU"}, {"group_idx", 1}},
				wire.OMap{{"type", "AllBlocksCleared"}},
			}}),
			wantEvents: []kvevents.Event{base,
				{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{1}, Medium: "GPU", HasGroup: true, GroupIdx: 1},
				{Kind: kvevents.AllBlocksCleared}},
		},
		{
			name: "hybrid groups decoded as given (translation filters)",
			frames: wire.Msg(t, "kv", 1, []any{0.0, []any{
				wire.Stored([]any{1}, nil, wire.Tokens(1, 4), 4, nil, nil, nil, []any{nil}, 1, "sliding_window", 128),
			}}),
			wantEvents: []kvevents.Event{with(func(e *kvevents.Event) {
				e.ExtraKeys = [][]kvevents.ExtraKey{nil}
				e.HasGroup, e.GroupIdx, e.SpecKind = true, 1, "sliding_window"
			})},
		},
		{
			name: "unknown and malformed events are skipped, the rest kept",
			frames: wire.Msg(t, "kv", 1, []any{0.0, []any{
				[]any{"KVConnectorEvent", 1, 2},
				wire.OMap{{"type", "SomethingNew"}},
				[]any{},
				42,
				wire.OMap{{"no_type", 1}},
				wire.Stored([]any{"x"[0:0]}, nil, wire.Tokens(1, 4), 4),   // empty-string hash
				wire.Stored([]any{1.5}, nil, wire.Tokens(1, 4), 4),        // float hash
				wire.Stored([]any{1}, nil, wire.Tokens(1, 3), 4),          // 3 tokens for one block of 4
				wire.Stored([]any{1}, nil, []any{-1, 2, 3, 4}, 4),         // negative token
				wire.Stored([]any{1}, nil, wire.Tokens(1, 4), 4, "three"), // lora_id not an int
				[]any{"BlockRemoved", "notalist"},
				wire.Stored([]any{1}, nil, wire.Tokens(1, 4), 4),
			}}),
			wantEvents: []kvevents.Event{base},
			wantSkipped: map[string]int{kvevents.SkipUnknownType: 2, kvevents.SkipMalformed: 6,
				kvevents.SkipBadHash: 2, kvevents.SkipTokenCount: 1},
		},
		{name: "two frames", frames: [][]byte{[]byte("kv"), wire.Seq8(1)}, wantReason: kvevents.RejectFrames},
		{name: "four frames", frames: [][]byte{nil, nil, wire.Seq8(1), nil}, wantReason: kvevents.RejectFrames},
		{name: "7-byte seq", frames: [][]byte{[]byte("kv"), wire.Seq8(1)[1:], wire.Encode(t, []any{0.0, []any{}})}, wantReason: kvevents.RejectSeq},
		{name: "payload not msgpack", frames: [][]byte{[]byte("kv"), wire.Seq8(1), {0xc1}}, wantReason: kvevents.RejectPayload},
		{name: "payload a string", frames: wire.Msg(t, "kv", 1, "hello"), wantReason: kvevents.RejectPayload},
		{name: "batch array of one", frames: wire.Msg(t, "kv", 1, []any{0.0}), wantReason: kvevents.RejectPayload},
		{name: "map batch without events", frames: wire.Msg(t, "kv", 1, wire.OMap{{"ts", 1.0}}), wantReason: kvevents.RejectPayload},
		{name: "truncated payload", frames: [][]byte{[]byte("kv"), wire.Seq8(1), wire.Encode(t, []any{0.0, []any{wire.Stored([]any{1}, nil, wire.Tokens(1, 4), 4)}})[:9]}, wantReason: kvevents.RejectPayload},
		{name: "payload cut inside a token", frames: [][]byte{[]byte("kv"), wire.Seq8(1), cut(wire.Encode(t, []any{0.0, []any{wire.Stored([]any{1}, nil,
			[]any{wire.U16(60000), wire.U16(60001), wire.U16(60002), wire.U16(60003)}, 4)}}), 2)}, wantReason: kvevents.RejectPayload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := kvevents.Decode(tt.frames)
			if tt.wantReason != "" {
				if err == nil {
					t.Fatalf("Decode: got nil error, want %q", tt.wantReason)
				}
				if got := kvevents.ReasonOf(err); got != tt.wantReason {
					t.Fatalf("reason: got %q (%v), want %q", got, err, tt.wantReason)
				}
				return
			}
			if err != nil {
				t.Fatalf("Decode: %v", err)
			}
			if !reflect.DeepEqual(b.Events, tt.wantEvents) {
				t.Errorf("events:\n got %+v\nwant %+v", b.Events, tt.wantEvents)
			}
			if len(b.Skipped)+len(tt.wantSkipped) > 0 && !reflect.DeepEqual(b.Skipped, tt.wantSkipped) {
				t.Errorf("skipped: got %v, want %v", b.Skipped, tt.wantSkipped)
			}
			if b.TS != tt.wantTS {
				t.Errorf("ts: got %v, want %v", b.TS, tt.wantTS)
			}
			if !reflect.DeepEqual(b.DPRank, tt.wantRank) {
				t.Errorf("rank: got %v, want %v", b.DPRank, tt.wantRank)
			}
			if b.Topic != string(tt.frames[0]) {
				t.Errorf("topic: got %q, want %q", b.Topic, tt.frames[0])
			}
		})
	}
}

// cut drops the last n bytes of b.
func cut(b []byte, n int) []byte { return b[:len(b)-n] }

func TestDecodeReplay(t *testing.T) {
	payload := wire.Encode(t, []any{1.0, []any{[]any{"AllBlocksCleared"}}, 0})
	end := wire.Seq8(kvevents.EndSeq)
	tests := []struct {
		name     string
		frames   [][]byte
		wantEnd  bool
		wantSeq  uint64
		wantTop  string
		wantFail string
	}{
		{name: "current layout", frames: [][]byte{{}, []byte("kv"), wire.Seq8(9), payload}, wantSeq: 9, wantTop: "kv"},
		{name: "current end marker", frames: [][]byte{{}, {}, end, {}}, wantEnd: true},
		{name: "old layout without topic", frames: [][]byte{{}, wire.Seq8(9), payload}, wantSeq: 9},
		{name: "old end marker", frames: [][]byte{{}, end, {}}, wantEnd: true},
		{name: "two frames", frames: [][]byte{{}, wire.Seq8(9)}, wantFail: kvevents.RejectFrames},
		{name: "short seq", frames: [][]byte{{}, []byte("kv"), wire.Seq8(9)[2:], payload}, wantFail: kvevents.RejectSeq},
		{name: "bad payload", frames: [][]byte{{}, wire.Seq8(9), {0xc1}}, wantFail: kvevents.RejectPayload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := kvevents.DecodeReplay(tt.frames)
			if tt.wantFail != "" {
				if got := kvevents.ReasonOf(err); err == nil || got != tt.wantFail {
					t.Fatalf("got err %v (reason %q), want reason %q", err, got, tt.wantFail)
				}
				return
			}
			if err != nil {
				t.Fatalf("DecodeReplay: %v", err)
			}
			if r.End != tt.wantEnd {
				t.Fatalf("end: got %v, want %v", r.End, tt.wantEnd)
			}
			if tt.wantEnd {
				return
			}
			if r.Batch.Seq != tt.wantSeq || r.Batch.Topic != tt.wantTop {
				t.Errorf("got seq %d topic %q, want %d %q", r.Batch.Seq, r.Batch.Topic, tt.wantSeq, tt.wantTop)
			}
			if len(r.Batch.Events) != 1 || r.Batch.Events[0].Kind != kvevents.AllBlocksCleared {
				t.Errorf("events: got %+v, want one AllBlocksCleared", r.Batch.Events)
			}
		})
	}
}

// benchPayload is one batch as the simulated replicas and vLLM publish it:
// one BlockStored of 32 blocks of 16 tokens, hashes spread over the whole
// uint64 range (half of them need msgpack's uint64 form), tokens below 50k.
func benchPayload(tb testing.TB, asMap bool) []byte {
	tb.Helper()
	hashes := make([]any, 32)
	for i := range hashes {
		hashes[i] = wire.U64(uint64(i+1) * 0x9e3779b97f4a7c15)
	}
	toks := make([]any, 32*16)
	for i := range toks {
		toks[i] = 3 + (i*7919)%50_000
	}
	var ev any = wire.Stored(hashes, nil, toks, 16, nil, "GPU", nil)
	if asMap {
		ev = wire.OMap{{"type", "BlockStored"}, {"block_hashes", hashes}, {"parent_block_hash", nil},
			{"token_ids", toks}, {"block_size", 16}, {"lora_id", nil}, {"medium", "GPU"}, {"lora_name", nil},
			{"extra_keys", make([]any, 32)}, {"group_idx", 0}, {"kv_cache_spec_kind", "full_attention"}}
	}
	return wire.Encode(tb, []any{1789095808.83, []any{ev}, 0})
}

// BenchmarkDecode decodes one 32-block batch per op; ns/block is the figure
// to compare with the store's per-block cost.
func BenchmarkDecode(b *testing.B) {
	for _, enc := range []string{"array", "map"} {
		b.Run(enc, func(b *testing.B) {
			frames := [][]byte{[]byte("kv"), wire.Seq8(1), benchPayload(b, enc == "map")}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := kvevents.Decode(frames); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(32*b.N), "ns/block")
		})
	}
}
