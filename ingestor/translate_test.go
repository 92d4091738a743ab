package ingestor_test

import (
	"context"
	"reflect"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/ingestor/internal/wire"
	"github.com/kvroute/kvroute/ingestor/kvevents"
)

// fakeLookup is a store's engine-hash map.
type fakeLookup struct {
	keys  map[uint64]kvroute.BlockKey
	calls int
}

func (f *fakeLookup) EngineKeys(_ context.Context, _, _ string, hs []uint64) ([]kvroute.BlockKey, []bool, error) {
	f.calls++
	keys, found := make([]kvroute.BlockKey, len(hs)), make([]bool, len(hs))
	for i, h := range hs {
		keys[i], found[i] = f.keys[h]
	}
	return keys, found, nil
}

func storedEv(hashes []uint64, parent *uint64, toks []uint32, bs int) kvevents.Event {
	ev := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: hashes, TokenIDs: toks, BlockSize: bs}
	if parent != nil {
		ev.HasParent, ev.Parent = true, *parent
	}
	return ev
}

func ptr[T any](v T) *T { return &v }

func translate(t *testing.T, tr *ingestor.Translator, evs ...kvevents.Event) ([]kvroute.IndexOp, ingestor.TranslateStats) {
	t.Helper()
	ops, st, err := tr.Translate(t.Context(), evs)
	if err != nil {
		t.Fatalf("Translate: %v", err)
	}
	return ops, st
}

func storeOps(keys []kvroute.BlockKey, hashes []uint64, first kvroute.BlockKey, tier kvroute.Tier) []kvroute.IndexOp {
	var ops []kvroute.IndexOp
	parent := first
	for i, k := range keys {
		ops = append(ops, kvroute.IndexOp{Kind: kvroute.OpStore, EngineHash: hashes[i], Key: k, Parent: parent, Tier: tier})
		parent = k
	}
	return ops
}

func TestTranslateChain(t *testing.T) {
	const model = "m"
	want := kvroute.BlockKeys(kvroute.KeySpace{Model: model}, 4, wire.UTokens(0, 16), nil)

	t.Run("across events of one batch", func(t *testing.T) {
		tr := ingestor.NewTranslator(model, "r1", 0, nil)
		ops, st := translate(t, tr,
			storedEv([]uint64{10, 11}, nil, wire.UTokens(0, 8), 4),
			storedEv([]uint64{12, 13}, ptr(uint64(11)), wire.UTokens(8, 8), 4))
		if got := storeOps(want, []uint64{10, 11, 12, 13}, kvroute.NoParent, kvroute.TierGPU); !reflect.DeepEqual(ops, got) {
			t.Errorf("ops:\n got %+v\nwant %+v", ops, got)
		}
		if st.Stored != 4 || st.Orphans != 0 {
			t.Errorf("stats: got %+v, want 4 stored, no orphans", st)
		}
	})

	t.Run("across batches, parent from the cache", func(t *testing.T) {
		lk := &fakeLookup{}
		tr := ingestor.NewTranslator(model, "r1", 0, lk)
		translate(t, tr, storedEv([]uint64{10, 11}, nil, wire.UTokens(0, 8), 4))
		ops, _ := translate(t, tr, storedEv([]uint64{12}, ptr(uint64(11)), wire.UTokens(8, 4), 4))
		if len(ops) != 1 || ops[0].Key != want[2] || ops[0].Parent != want[1] {
			t.Errorf("ops: %+v, want key %v parent %v", ops, want[2], want[1])
		}
		if lk.calls != 0 {
			t.Errorf("store lookups: got %d, want 0", lk.calls)
		}
	})

	t.Run("parent from the store after a restart of the ingestor", func(t *testing.T) {
		lk := &fakeLookup{keys: map[uint64]kvroute.BlockKey{11: want[1]}}
		tr := ingestor.NewTranslator(model, "r1", 0, lk)
		ops, _ := translate(t, tr,
			storedEv([]uint64{12}, ptr(uint64(11)), wire.UTokens(8, 4), 4),
			storedEv([]uint64{13}, ptr(uint64(12)), wire.UTokens(12, 4), 4))
		if got := storeOps(want[2:], []uint64{12, 13}, want[1], kvroute.TierGPU); !reflect.DeepEqual(ops, got) {
			t.Errorf("ops:\n got %+v\nwant %+v", ops, got)
		}
		if lk.calls != 1 {
			t.Errorf("store lookups: got %d, want 1 per batch", lk.calls)
		}
	})

	t.Run("unknown parent is an orphan, and so are its children", func(t *testing.T) {
		lk := &fakeLookup{}
		tr := ingestor.NewTranslator(model, "r1", 0, lk)
		ops, st := translate(t, tr,
			storedEv([]uint64{12}, ptr(uint64(99)), wire.UTokens(8, 4), 4),
			storedEv([]uint64{13}, ptr(uint64(12)), wire.UTokens(12, 4), 4),
			storedEv([]uint64{10}, nil, wire.UTokens(0, 4), 4))
		if len(ops) != 1 || ops[0].EngineHash != 10 {
			t.Errorf("ops: got %+v, want only hash 10", ops)
		}
		if st.Orphans != 2 || st.Skipped[ingestor.SkipOrphan] != 2 {
			t.Errorf("stats: got %+v, want 2 orphans, skipped as such", st)
		}
	})

	t.Run("block size is read from the event", func(t *testing.T) {
		tr := ingestor.NewTranslator(model, "r1", 0, nil)
		ops, _ := translate(t, tr, storedEv([]uint64{1, 2}, nil, wire.UTokens(0, 64), 32))
		want := kvroute.BlockKeys(kvroute.KeySpace{Model: model}, 32, wire.UTokens(0, 64), nil)
		if len(ops) != 2 || ops[0].Key != want[0] || ops[1].Key != want[1] {
			t.Errorf("ops %+v, want keys %v", ops, want)
		}
	})

	t.Run("seed separates deployments", func(t *testing.T) {
		tr := ingestor.NewTranslator(model, "r1", 42, nil)
		ops, _ := translate(t, tr, storedEv([]uint64{1}, nil, wire.UTokens(0, 4), 4))
		want := kvroute.BlockKeys(kvroute.KeySpace{Model: model, Seed: 42}, 4, wire.UTokens(0, 4), nil)
		if ops[0].Key != want[0] {
			t.Errorf("key %v, want %v", ops[0].Key, want[0])
		}
	})
}

func TestTranslateOpsKinds(t *testing.T) {
	const model = "m"
	keys := kvroute.BlockKeys(kvroute.KeySpace{Model: model}, 4, wire.UTokens(0, 12), nil)

	t.Run("offload events resolve through known hashes", func(t *testing.T) {
		tr := ingestor.NewTranslator(model, "r1", 0, &fakeLookup{})
		translate(t, tr, storedEv([]uint64{10, 11, 12}, nil, wire.UTokens(0, 12), 4))
		off := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{11, 12, 77}, TokenIDs: []uint32{}, Medium: "CPU"}
		ops, st := translate(t, tr, off)
		want := []kvroute.IndexOp{
			{Kind: kvroute.OpStore, EngineHash: 11, Key: keys[1], Parent: keys[0], Tier: kvroute.TierHost},
			{Kind: kvroute.OpStore, EngineHash: 12, Key: keys[2], Parent: keys[1], Tier: kvroute.TierHost},
		}
		if !reflect.DeepEqual(ops, want) {
			t.Errorf("ops:\n got %+v\nwant %+v", ops, want)
		}
		if st.Skipped[ingestor.SkipUnknownOffload] != 1 {
			t.Errorf("stats: got %+v, want 1 unknown offload skipped", st)
		}
	})

	t.Run("offload of hashes known only to the store chains within the event", func(t *testing.T) {
		lk := &fakeLookup{keys: map[uint64]kvroute.BlockKey{10: keys[0], 11: keys[1], 12: keys[2]}}
		tr := ingestor.NewTranslator(model, "r1", 0, lk)
		p := uint64(10)
		off := kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{11, 12}, HasParent: true, Parent: p, Medium: "CPU"}
		ops, _ := translate(t, tr, off)
		want := []kvroute.IndexOp{
			{Kind: kvroute.OpStore, EngineHash: 11, Key: keys[1], Parent: keys[0], Tier: kvroute.TierHost},
			{Kind: kvroute.OpStore, EngineHash: 12, Key: keys[2], Parent: keys[1], Tier: kvroute.TierHost},
		}
		if !reflect.DeepEqual(ops, want) {
			t.Errorf("ops:\n got %+v\nwant %+v", ops, want)
		}
	})

	t.Run("removal and clear", func(t *testing.T) {
		tr := ingestor.NewTranslator(model, "r1", 0, &fakeLookup{})
		ops, st := translate(t, tr,
			storedEv([]uint64{10}, nil, wire.UTokens(0, 4), 4),
			kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{10, 99}},
			kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{10}, Medium: "CPU"},
			kvevents.Event{Kind: kvevents.AllBlocksCleared},
			storedEv([]uint64{11}, ptr(uint64(10)), wire.UTokens(4, 4), 4))
		want := []kvroute.IndexOp{
			{Kind: kvroute.OpStore, EngineHash: 10, Key: keys[0], Parent: kvroute.NoParent},
			{Kind: kvroute.OpRemove, EngineHash: 10},
			{Kind: kvroute.OpRemove, EngineHash: 99},
			{Kind: kvroute.OpRemove, EngineHash: 10, Tier: kvroute.TierHost},
			{Kind: kvroute.OpClear},
		}
		if !reflect.DeepEqual(ops, want) {
			t.Errorf("ops:\n got %+v\nwant %+v", ops, want)
		}
		if st.Removed != 3 || st.Clears != 1 || st.Orphans != 1 {
			t.Errorf("stats: got %+v, want 3 removed, 1 clear, 1 orphan (a block after the clear cannot chain from one before it)", st)
		}
	})

	t.Run("hybrid model: only the full-attention group", func(t *testing.T) {
		tr := ingestor.NewTranslator(model, "r1", 0, nil)
		full := storedEv([]uint64{10}, nil, wire.UTokens(0, 4), 4)
		full.HasGroup, full.GroupIdx, full.SpecKind = true, 0, "full_attention"
		swa := storedEv([]uint64{10}, nil, wire.UTokens(0, 4), 4)
		swa.HasGroup, swa.GroupIdx, swa.SpecKind = true, 1, "sliding_window"
		mamba := storedEv([]uint64{20}, nil, wire.UTokens(0, 4), 4)
		mamba.HasGroup, mamba.GroupIdx, mamba.SpecKind = true, 2, "mamba"
		ops, st := translate(t, tr, full, swa, mamba,
			kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{10}, HasGroup: true, GroupIdx: 1},
			kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{10}, HasGroup: true, GroupIdx: 3},
			kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{10}, HasGroup: true, GroupIdx: 0})
		want := []kvroute.IndexOp{
			{Kind: kvroute.OpStore, EngineHash: 10, Key: keys[0]},
			{Kind: kvroute.OpRemove, EngineHash: 10},
		}
		if !reflect.DeepEqual(ops, want) {
			t.Errorf("ops:\n got %+v\nwant %+v", ops, want)
		}
		if st.Skipped[ingestor.SkipNonFullAttention] != 4 {
			t.Errorf("skipped: got %+v, want 4 non-full-attention", st.Skipped)
		}
	})
}

// TestTranslateMatchesRequests checks that the keys derived from an event
// equal the keys the API derives for a request with the same tokens, LoRA
// and cache salt; otherwise no request would ever hit the index.
func TestTranslateMatchesRequests(t *testing.T) {
	const model, bs = "m", 4
	toks := wire.UTokens(100, 12)
	s := func(v string) kvevents.ExtraKey { return kvevents.ExtraKey{Kind: kvevents.ExtraString, Str: v} }
	tests := []struct {
		name      string
		lora      string
		loraID    *int64
		extras    [][]kvevents.ExtraKey
		reqLoRA   string
		reqSalt   string
		wantEqual bool
	}{
		{name: "plain", wantEqual: true},
		{name: "extra_keys all nil", extras: [][]kvevents.ExtraKey{nil, nil, nil}, wantEqual: true},
		{name: "salt on block 0", extras: [][]kvevents.ExtraKey{{s("s1")}, nil, nil}, reqSalt: "s1", wantEqual: true},
		{name: "hex-looking salt", extras: [][]kvevents.ExtraKey{{s("9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08")}},
			reqSalt: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", wantEqual: true},
		{name: "salt differs", extras: [][]kvevents.ExtraKey{{s("s1")}}, reqSalt: "s2"},
		{name: "salt missing from request", extras: [][]kvevents.ExtraKey{{s("s1")}}},
		{name: "lora name on every block", lora: "ad1", extras: [][]kvevents.ExtraKey{{s("ad1")}, {s("ad1")}, {s("ad1")}}, reqLoRA: "ad1", wantEqual: true},
		{name: "lora and salt", lora: "ad1", extras: [][]kvevents.ExtraKey{{s("ad1"), s("s1")}, {s("ad1")}, {s("ad1")}}, reqLoRA: "ad1", reqSalt: "s1", wantEqual: true},
		{name: "lora without extra_keys (older versions)", lora: "ad1", reqLoRA: "ad1", wantEqual: true},
		{name: "lora vs base model", lora: "ad1", extras: [][]kvevents.ExtraKey{{s("ad1")}}},
		{name: "lora_id only never matches the base model", loraID: ptr(int64(3)), extras: [][]kvevents.ExtraKey{{{Kind: kvevents.ExtraInt, Int: 3}}}},
		{name: "multimodal pair is not a salt", extras: [][]kvevents.ExtraKey{{{Kind: kvevents.ExtraPair, Str: "img", Int: 0}}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ev := storedEv([]uint64{1, 2, 3}, nil, toks, bs)
			ev.LoRAName, ev.ExtraKeys = tt.lora, tt.extras
			if tt.loraID != nil {
				ev.HasLoRAID, ev.LoRAID = true, *tt.loraID
			}
			ops, _ := translate(t, ingestor.NewTranslator(model, "r", 0, nil), ev)
			req := kvroute.BlockKeys(kvroute.KeySpace{Model: model, LoRA: tt.reqLoRA}, bs, toks, kvroute.RequestExtras(tt.reqSalt))
			equal := len(ops) == len(req)
			for i := range ops {
				equal = equal && ops[i].Key == req[i]
			}
			if equal != tt.wantEqual {
				t.Errorf("event keys equal request keys: got %v, want %v", equal, tt.wantEqual)
			}
		})
	}

	t.Run("a salt-like string on a continuation is not a salt", func(t *testing.T) {
		tr := ingestor.NewTranslator(model, "r", 0, nil)
		translate(t, tr, storedEv([]uint64{1}, nil, toks[:4], bs))
		ev := storedEv([]uint64{2}, ptr(uint64(1)), toks[4:8], bs)
		ev.ExtraKeys = [][]kvevents.ExtraKey{{s("mm")}}
		ops, _ := translate(t, tr, ev)
		x := ingestor.BlockExtras(&ev)
		if x[0].Salt != "" || len(x[0].MM) != 1 || x[0].MM[0].ID != "mm" {
			t.Errorf("extras: got %+v, want no salt and one multimodal identifier \"mm\"", x)
		}
		plain := kvroute.BlockKeys(kvroute.KeySpace{Model: model}, bs, toks[:8], nil)
		if ops[0].Key == plain[1] {
			t.Errorf("key: got the plain key %v, want the multimodal identifier to change it", ops[0].Key)
		}
	})
}
