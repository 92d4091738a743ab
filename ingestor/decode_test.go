package ingestor_test

import (
	"bytes"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"testing"

	"github.com/kvroute/kvroute/ingestor"
)

var update = flag.Bool("update", false, "rewrite testdata fixtures")

const big = uint64(15760518052499183552) // >= 2^63: msgpack 0xcf

func TestDecode(t *testing.T) {
	h32 := bytes.Repeat([]byte{0xaa}, 24)
	h32 = append(h32, 0, 0, 0, 0, 0, 0, 0x01, 0x02) // sha256: last 8 bytes
	h16 := append(bytes.Repeat([]byte{0xbb}, 8), 0, 0, 0, 0, 0, 0, 0x03, 0x04)
	base := ingestor.Event{Kind: ingestor.BlockStored, BlockHashes: []uint64{1}, TokenIDs: utokens(1, 4), BlockSize: 4}
	with := func(f func(*ingestor.Event)) ingestor.Event {
		e := base
		f(&e)
		return e
	}
	rank0 := 0
	tests := []struct {
		name        string
		frames      [][]byte
		wantReason  string // whole-message rejection
		wantEvents  []ingestor.Event
		wantSkipped map[string]int
		wantTS      float64
		wantRank    *int
	}{
		{
			name:       "array batch, 3 elements, minimal BlockStored",
			frames:     msg(t, "kv", 7, []any{1.5, []any{stored([]any{1}, nil, tokens(1, 4), 4)}, 0}),
			wantEvents: []ingestor.Event{base},
			wantTS:     1.5,
			wantRank:   &rank0,
		},
		{
			name:       "array batch, 2 elements (very old)",
			frames:     msg(t, "kv", 7, []any{1.5, []any{stored([]any{1}, nil, tokens(1, 4), 4)}}),
			wantEvents: []ingestor.Event{base},
			wantTS:     1.5,
		},
		{
			name: "map batch",
			frames: msg(t, "kv", 7, omap{{"ts", 1.5}, {"events", []any{stored([]any{1}, nil, tokens(1, 4), 4)}},
				{"data_parallel_rank", 0}, {"future", "ignored"}}),
			wantEvents: []ingestor.Event{base},
			wantTS:     1.5,
			wantRank:   &rank0,
		},
		{
			name:       "float32 ts and nil rank",
			frames:     msg(t, "kv", 7, []any{f32(2.5), []any{}, nil}),
			wantEvents: nil,
			wantTS:     2.5,
		},
		{
			name: "hash widths: fixint, uint8, uint16, uint32, uint64 >= 2^63, int64",
			frames: msg(t, "kv", 1, []any{0.0, []any{
				[]any{"BlockRemoved", []any{5, u8(200), u16(60000), u32(4000000000), u64(big), i64(-1)}},
			}}),
			wantEvents: []ingestor.Event{{Kind: ingestor.BlockRemoved,
				BlockHashes: []uint64{5, 200, 60000, 4000000000, big, 1<<64 - 1}}},
		},
		{
			name: "token widths: fixint, uint8, uint16, uint32, uint64, integral float",
			frames: msg(t, "kv", 1, []any{0.0, []any{
				stored([]any{1}, nil, []any{5, u8(200), u16(60000), u32(4000000000), u64(7), 3.0}, 6),
			}}),
			wantEvents: []ingestor.Event{{Kind: ingestor.BlockStored, BlockHashes: []uint64{1},
				TokenIDs: []uint32{5, 200, 60000, 4000000000, 7, 3}, BlockSize: 6}},
		},
		{
			name: "token ids beyond uint32 or negative are malformed",
			frames: msg(t, "kv", 1, []any{0.0, []any{
				stored([]any{1}, nil, []any{1, 2, 3, u64(1 << 32)}, 4),
				stored([]any{1}, nil, []any{1, 2, 3, i64(-4)}, 4),
				stored([]any{1}, nil, []any{1, 2, 3, u64(big)}, 4),
			}}),
			wantSkipped: map[string]int{ingestor.SkipMalformed: 3},
		},
		{
			name: "bytes hashes: 32-byte sha256 and 16-byte xxhash, last 8 bytes big-endian",
			frames: msg(t, "kv", 1, []any{0.0, []any{
				stored([]any{h32, h16}, h16, tokens(0, 2), 1),
			}}),
			wantEvents: []ingestor.Event{{Kind: ingestor.BlockStored, BlockHashes: []uint64{0x0102, 0x0304},
				HasParent: true, Parent: 0x0304, TokenIDs: utokens(0, 2), BlockSize: 1}},
		},
		{
			name:       "parent as uint64",
			frames:     msg(t, "kv", 1, []any{0.0, []any{stored([]any{1}, u64(big), tokens(1, 4), 4)}}),
			wantEvents: []ingestor.Event{with(func(e *ingestor.Event) { e.HasParent, e.Parent = true, big })},
		},
		{
			name: "all positional fields",
			frames: msg(t, "kv", 1, []any{0.0, []any{stored([]any{1}, nil, tokens(1, 4), 4,
				3, "CPU", "ad1", []any{[]any{"ad1", "salt"}}, 0, "full_attention", nil)}}),
			wantEvents: []ingestor.Event{with(func(e *ingestor.Event) {
				e.HasLoRAID, e.LoRAID, e.Medium, e.LoRAName = true, 3, "CPU", "ad1"
				e.ExtraKeys = [][]ingestor.ExtraKey{{{Kind: ingestor.ExtraString, Str: "ad1"}, {Kind: ingestor.ExtraString, Str: "salt"}}}
				e.HasGroup, e.SpecKind = true, "full_attention"
			})},
		},
		{
			name: "token-less offload event",
			frames: msg(t, "kv", 1, []any{0.0, []any{
				stored([]any{1, 2}, nil, []any{}, 0, nil, "CPU"),
			}}),
			wantEvents: []ingestor.Event{{Kind: ingestor.BlockStored, BlockHashes: []uint64{1, 2}, TokenIDs: []uint32{}, Medium: "CPU"}},
		},
		{
			name: "extra_keys: nil, strings, pairs, bytes, ints",
			frames: msg(t, "kv", 1, []any{0.0, []any{stored([]any{1, 2, 3}, nil, tokens(0, 3), 1, nil, nil, nil,
				[]any{nil, []any{"mmhash", []any{"img1", 5}}, []any{[]byte{1, 2}, 7}})}}),
			wantEvents: []ingestor.Event{{Kind: ingestor.BlockStored, BlockHashes: []uint64{1, 2, 3}, TokenIDs: utokens(0, 3), BlockSize: 1,
				ExtraKeys: [][]ingestor.ExtraKey{nil,
					{{Kind: ingestor.ExtraString, Str: "mmhash"}, {Kind: ingestor.ExtraPair, Str: "img1", Int: 5}},
					{{Kind: ingestor.ExtraBytes, Str: "\x01\x02"}, {Kind: ingestor.ExtraInt, Int: 7}}}}},
		},
		{
			name: "map events, both types, unknown key ignored, defaults omitted",
			frames: msg(t, "kv", 1, []any{0.0, []any{
				omap{{"type", "BlockStored"}, {"block_hashes", []any{1}}, {"parent_block_hash", nil}, {"token_ids", tokens(1, 4)},
					{"block_size", 4}, {"lora_id", nil}, {"medium", nil}, {"lora_name", nil}, {"new_field", []any{1, 2}}},
				omap{{"type", "BlockRemoved"}, {"block_hashes", []any{1}}, {"medium", "GPU"}, {"group_idx", 1}},
				omap{{"type", "AllBlocksCleared"}},
			}}),
			wantEvents: []ingestor.Event{base,
				{Kind: ingestor.BlockRemoved, BlockHashes: []uint64{1}, Medium: "GPU", HasGroup: true, GroupIdx: 1},
				{Kind: ingestor.AllBlocksCleared}},
		},
		{
			name: "hybrid groups decoded as given (translation filters)",
			frames: msg(t, "kv", 1, []any{0.0, []any{
				stored([]any{1}, nil, tokens(1, 4), 4, nil, nil, nil, []any{nil}, 1, "sliding_window", 128),
			}}),
			wantEvents: []ingestor.Event{with(func(e *ingestor.Event) {
				e.ExtraKeys = [][]ingestor.ExtraKey{nil}
				e.HasGroup, e.GroupIdx, e.SpecKind = true, 1, "sliding_window"
			})},
		},
		{
			name: "unknown and malformed events are skipped, the rest kept",
			frames: msg(t, "kv", 1, []any{0.0, []any{
				[]any{"KVConnectorEvent", 1, 2},
				omap{{"type", "SomethingNew"}},
				[]any{},
				42,
				omap{{"no_type", 1}},
				stored([]any{"x"[0:0]}, nil, tokens(1, 4), 4),   // empty-string hash
				stored([]any{1.5}, nil, tokens(1, 4), 4),        // float hash
				stored([]any{1}, nil, tokens(1, 3), 4),          // 3 tokens for one block of 4
				stored([]any{1}, nil, []any{-1, 2, 3, 4}, 4),    // negative token
				stored([]any{1}, nil, tokens(1, 4), 4, "three"), // lora_id not an int
				[]any{"BlockRemoved", "notalist"},
				stored([]any{1}, nil, tokens(1, 4), 4),
			}}),
			wantEvents: []ingestor.Event{base},
			wantSkipped: map[string]int{ingestor.SkipUnknownType: 2, ingestor.SkipMalformed: 6,
				ingestor.SkipBadHash: 2, ingestor.SkipTokenCount: 1},
		},
		{name: "two frames", frames: [][]byte{[]byte("kv"), seq8(1)}, wantReason: ingestor.RejectFrames},
		{name: "four frames", frames: [][]byte{nil, nil, seq8(1), nil}, wantReason: ingestor.RejectFrames},
		{name: "7-byte seq", frames: [][]byte{[]byte("kv"), seq8(1)[1:], mp(t, []any{0.0, []any{}})}, wantReason: ingestor.RejectSeq},
		{name: "payload not msgpack", frames: [][]byte{[]byte("kv"), seq8(1), {0xc1}}, wantReason: ingestor.RejectPayload},
		{name: "payload a string", frames: msg(t, "kv", 1, "hello"), wantReason: ingestor.RejectPayload},
		{name: "batch array of one", frames: msg(t, "kv", 1, []any{0.0}), wantReason: ingestor.RejectPayload},
		{name: "map batch without events", frames: msg(t, "kv", 1, omap{{"ts", 1.0}}), wantReason: ingestor.RejectPayload},
		{name: "truncated payload", frames: [][]byte{[]byte("kv"), seq8(1), mp(t, []any{0.0, []any{stored([]any{1}, nil, tokens(1, 4), 4)}})[:9]}, wantReason: ingestor.RejectPayload},
		{name: "payload cut inside a token", frames: [][]byte{[]byte("kv"), seq8(1), cut(mp(t, []any{0.0, []any{stored([]any{1}, nil,
			[]any{u16(60000), u16(60001), u16(60002), u16(60003)}, 4)}}), 2)}, wantReason: ingestor.RejectPayload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := ingestor.Decode(tt.frames)
			if tt.wantReason != "" {
				if err == nil {
					t.Fatalf("Decode: got nil error, want %q", tt.wantReason)
				}
				if got := ingestor.ReasonOf(err); got != tt.wantReason {
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
	payload := mp(t, []any{1.0, []any{[]any{"AllBlocksCleared"}}, 0})
	end := seq8(ingestor.EndSeq)
	tests := []struct {
		name     string
		frames   [][]byte
		wantEnd  bool
		wantSeq  uint64
		wantTop  string
		wantFail string
	}{
		{name: "current layout", frames: [][]byte{{}, []byte("kv"), seq8(9), payload}, wantSeq: 9, wantTop: "kv"},
		{name: "current end marker", frames: [][]byte{{}, {}, end, {}}, wantEnd: true},
		{name: "old layout without topic", frames: [][]byte{{}, seq8(9), payload}, wantSeq: 9},
		{name: "old end marker", frames: [][]byte{{}, end, {}}, wantEnd: true},
		{name: "two frames", frames: [][]byte{{}, seq8(9)}, wantFail: ingestor.RejectFrames},
		{name: "short seq", frames: [][]byte{{}, []byte("kv"), seq8(9)[2:], payload}, wantFail: ingestor.RejectSeq},
		{name: "bad payload", frames: [][]byte{{}, seq8(9), {0xc1}}, wantFail: ingestor.RejectPayload},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := ingestor.DecodeReplay(tt.frames)
			if tt.wantFail != "" {
				if got := ingestor.ReasonOf(err); err == nil || got != tt.wantFail {
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
			if len(r.Batch.Events) != 1 || r.Batch.Events[0].Kind != ingestor.AllBlocksCleared {
				t.Errorf("events: got %+v", r.Batch.Events)
			}
		})
	}
}

// goldenV026 is the batch VLLM_EVENTS.md §2 shows as captured from vLLM
// v0.26.0 (tokens 1..16; the spec elides them), encoded the way msgspec
// does: map events in field order, compact integers, 0xcf for the hash.
func goldenV026(tb testing.TB) []byte {
	tb.Helper()
	ev := omap{
		{"type", "BlockStored"}, {"block_hashes", []any{u64(big)}}, {"parent_block_hash", nil},
		{"token_ids", tokens(1, 16)}, {"block_size", 16}, {"lora_id", nil}, {"medium", "GPU"},
		{"lora_name", nil}, {"extra_keys", []any{nil}}, {"group_idx", 0}, {"kv_cache_spec_kind", "full_attention"},
	}
	return mp(tb, []any{1789095808.83, []any{ev}, 0})
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
	b, err := ingestor.Decode([][]byte{[]byte("kv"), seq8(0), payload})
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	want := []ingestor.Event{{
		Kind: ingestor.BlockStored, BlockHashes: []uint64{big}, TokenIDs: utokens(1, 16), BlockSize: 16,
		Medium: "GPU", ExtraKeys: [][]ingestor.ExtraKey{nil}, HasGroup: true, SpecKind: "full_attention",
	}}
	if !reflect.DeepEqual(b.Events, want) {
		t.Errorf("events:\n got %+v\nwant %+v", b.Events, want)
	}
	if b.TS != 1789095808.83 || b.DPRank == nil || *b.DPRank != 0 {
		t.Errorf("ts %v rank %v", b.TS, b.DPRank)
	}
}

func FuzzDecode(f *testing.F) {
	f.Add([]byte("kv"), seq8(1), goldenV026(f))
	f.Add([]byte(""), seq8(0), mp(f, []any{1.0, []any{stored([]any{1, u64(big)}, 3, tokens(0, 8), 4, 1, "CPU", "a", []any{[]any{"a", []any{"i", 1}}, nil})}}))
	f.Add([]byte("x"), seq8(2), mp(f, omap{{"ts", 1}, {"events", []any{omap{{"type", "BlockRemoved"}, {"block_hashes", []any{[]byte("12345678")}}}}}}))
	f.Add([]byte("x"), []byte{1, 2}, []byte{0x93})
	f.Fuzz(func(t *testing.T, topic, seq, payload []byte) {
		b, err := ingestor.Decode([][]byte{topic, seq, payload})
		if err != nil {
			if len(b.Events) != 0 {
				t.Fatalf("rejected message produced %d events", len(b.Events))
			}
			return
		}
		for _, ev := range b.Events {
			if ev.Kind == ingestor.BlockStored && len(ev.TokenIDs) > 0 && len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
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

// benchPayload is one batch as the simulated replicas and vLLM publish it:
// one BlockStored of 32 blocks of 16 tokens, hashes spread over the whole
// uint64 range (half of them need msgpack's uint64 form), tokens below 50k.
func benchPayload(tb testing.TB, asMap bool) []byte {
	tb.Helper()
	hashes := make([]any, 32)
	for i := range hashes {
		hashes[i] = u64(uint64(i+1) * 0x9e3779b97f4a7c15)
	}
	toks := make([]any, 32*16)
	for i := range toks {
		toks[i] = 3 + (i*7919)%50_000
	}
	var ev any = stored(hashes, nil, toks, 16, nil, "GPU", nil)
	if asMap {
		ev = omap{{"type", "BlockStored"}, {"block_hashes", hashes}, {"parent_block_hash", nil},
			{"token_ids", toks}, {"block_size", 16}, {"lora_id", nil}, {"medium", "GPU"}, {"lora_name", nil},
			{"extra_keys", make([]any, 32)}, {"group_idx", 0}, {"kv_cache_spec_kind", "full_attention"}}
	}
	return mp(tb, []any{1789095808.83, []any{ev}, 0})
}

// BenchmarkDecode decodes one 32-block batch per op; ns/block is the figure
// to compare with the store's per-block cost.
func BenchmarkDecode(b *testing.B) {
	for _, enc := range []string{"array", "map"} {
		b.Run(enc, func(b *testing.B) {
			frames := [][]byte{[]byte("kv"), seq8(1), benchPayload(b, enc == "map")}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := ingestor.Decode(frames); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(32*b.N), "ns/block")
		})
	}
}
