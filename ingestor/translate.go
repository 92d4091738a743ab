package ingestor

import (
	"context"
	"encoding/hex"
	"fmt"
	"strconv"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor/kvevents"
)

// KeyLookup resolves engine hashes the translator has not seen itself to the
// router keys the store recorded for them. The store satisfies it.
type KeyLookup interface {
	// EngineKeys returns, per engine hash in order, the router key the
	// store recorded for it and whether it had one.
	EngineKeys(ctx context.Context, model, replica string, engineHashes []uint64) ([]kvroute.BlockKey, []bool, error)
}

// Reasons the translator skips an event or a block (see TranslateStats).
const (
	// SkipNonFullAttention: an event of a hybrid model's sliding-window or
	// mamba group; only the full-attention group answers prefix lookups.
	SkipNonFullAttention = "non_full_attention"
	// SkipOrphan: a BlockStored whose parent hash is unknown, so its keys
	// cannot be computed.
	SkipOrphan = "orphan"
	// SkipUnknownOffload: a token-less offload event naming a hash that was
	// never stored with tokens.
	SkipUnknownOffload = "unknown_offload"
)

// TranslateStats says what one Translate call did.
type TranslateStats struct {
	Stored  int // OpStore ops emitted
	Removed int // OpRemove ops emitted
	Clears  int // OpClear ops emitted
	// Orphans counts BlockStored events skipped for an unknown parent.
	Orphans int
	// Skipped counts skipped events (or offload blocks) by reason.
	Skipped map[string]int
}

func (s *TranslateStats) skip(reason string, n int) {
	if s.Skipped == nil {
		s.Skipped = make(map[string]int)
	}
	s.Skipped[reason] += n
}

// maxCached bounds the per-replica engine-hash cache. A vLLM replica holds
// at most a few hundred thousand blocks; past the bound the cache starts
// over and misses fall through to the store.
const maxCached = 1 << 20

type cached struct {
	key    kvroute.BlockKey
	parent kvroute.BlockKey
}

// Translator turns one replica's decoded events into index operations. It
// keeps the replica's engine-hash -> router-key map in memory so that most
// batches need no store round trip: a BlockStored chains from its parent's
// router key, and the parent is almost always a block this translator keyed
// itself a moment ago. It is not safe for concurrent use; each subscriber
// owns one.
type Translator struct {
	model, replica string
	seed           uint64
	lookup         KeyLookup

	cache map[uint64]cached
	keys  []kvroute.BlockKey // reused by appendOps
	// nonFull and full record the hybrid-model groups seen in BlockStored
	// events, so that BlockRemoved (which carries no spec kind) can be
	// filtered the same way.
	nonFull map[int64]bool
	full    map[int64]bool
}

// NewTranslator returns a translator for one replica. seed is the key-space
// seed shared with the API (kvroute.KeySpace.Seed). lookup resolves the
// engine hashes the translator has not keyed itself; a nil lookup resolves
// none, so that an event chained from such a hash is skipped as an orphan
// (a test of the translator alone needs no store).
func NewTranslator(model, replica string, seed uint64, lookup KeyLookup) *Translator {
	t := &Translator{model: model, replica: replica, seed: seed, lookup: lookup}
	t.Reset()
	return t
}

// Reset forgets every cached key; called when the replica's entries are
// cleared, so that the cache never outlives what the store holds.
func (t *Translator) Reset() {
	t.cache = make(map[uint64]cached)
	t.nonFull = make(map[int64]bool)
	t.full = make(map[int64]bool)
}

// Cached reports the router key the translator holds for an engine hash.
func (t *Translator) Cached(engineHash uint64) (kvroute.BlockKey, bool) {
	c, ok := t.cache[engineHash]
	return c.key, ok
}

func (t *Translator) remember(h uint64, c cached) {
	if len(t.cache) >= maxCached {
		t.cache = make(map[uint64]cached)
	}
	t.cache[h] = c
}

// KeySpaceOf returns the key space an event's blocks belong to. The LoRA
// adapter is part of the root, so every key of an adapter's prompt differs
// from the base model's. Old versions send only the integer lora_id, which
// cannot be mapped to the name a request carries; such blocks get a key
// space of their own ("lora-id:N") so they are never confused with the
// base model, at the cost of never matching a request.
func KeySpaceOf(model string, seed uint64, ev *kvevents.Event) kvroute.KeySpace {
	ks := kvroute.KeySpace{Model: model, LoRA: ev.LoRAName, Seed: seed}
	if ks.LoRA == "" && ev.HasLoRAID {
		ks.LoRA = "lora-id:" + strconv.FormatInt(ev.LoRAID, 10)
	}
	return ks
}

// BlockExtras converts an event's per-block extra_keys into the router's
// BlockExtra, so that an event and a request for the same prompt key alike.
//
// vLLM builds each block's extra keys as lora name, multimodal identifiers,
// cache salt (block 0 of a prompt only), prompt-embeds digests. So:
//   - a leading item equal to the event's lora_name (or lora_id) is dropped:
//     the adapter is already in the key space;
//   - [identifier, offset] pairs are multimodal items (MMRef);
//   - on the prompt's first block (the event has no parent), the LAST plain
//     string is the cache salt. A salt always comes after every multimodal
//     identifier, and new-style identifiers are pairs, so this is exact
//     except for one case: an old-style (string) multimodal identifier on
//     block 0 of a request without salt is taken as the salt. That only
//     changes how such a block is keyed, consistently for the whole chain,
//     and requests carrying images cannot be keyed by the API anyway. The
//     opposite rule (recognize identifiers by their shape, e.g. a hex
//     digest) would break the common case, since users pick hex salts;
//   - any other string is an old-style multimodal identifier (offset 0);
//   - bytes (prompt-embeds digests), integers and anything else go to Other,
//     typed by a prefix so that a bytes item never equals a string item.
func BlockExtras(ev *kvevents.Event) []kvroute.BlockExtra {
	if len(ev.ExtraKeys) == 0 {
		return nil
	}
	var out []kvroute.BlockExtra
	for i, items := range ev.ExtraKeys {
		if len(items) > 0 {
			first := items[0]
			if (first.Kind == kvevents.ExtraString && ev.LoRAName != "" && first.Str == ev.LoRAName) ||
				(first.Kind == kvevents.ExtraInt && ev.HasLoRAID && first.Int == ev.LoRAID) {
				items = items[1:]
			}
		}
		if len(items) == 0 {
			continue
		}
		salt := -1
		if i == 0 && !ev.HasParent {
			for j := len(items) - 1; j >= 0; j-- {
				if items[j].Kind == kvevents.ExtraString {
					salt = j
					break
				}
			}
		}
		var x kvroute.BlockExtra
		for j, it := range items {
			switch {
			case j == salt:
				x.Salt = it.Str
			case it.Kind == kvevents.ExtraString:
				x.MM = append(x.MM, kvroute.MMRef{ID: it.Str})
			case it.Kind == kvevents.ExtraPair:
				x.MM = append(x.MM, kvroute.MMRef{ID: it.Str, Offset: it.Int})
			case it.Kind == kvevents.ExtraBytes:
				x.Other = append(x.Other, "bytes:"+hex.EncodeToString([]byte(it.Str)))
			case it.Kind == kvevents.ExtraInt:
				x.Other = append(x.Other, "int:"+strconv.FormatInt(it.Int, 10))
			default:
				x.Other = append(x.Other, "other:"+it.Str)
			}
		}
		if out == nil {
			out = make([]kvroute.BlockExtra, len(ev.ExtraKeys))
		}
		out[i] = x
	}
	return out
}

// Translate turns a batch's events into index operations, in order. It
// needs at most one store round trip per batch: every parent (and offloaded
// hash) neither cached nor stored earlier in the same batch is looked up
// together first.
//
// A BlockStored whose parent is unknown even to the store is an orphan: its
// keys chain from a key nobody knows, so it cannot be indexed. It is skipped
// and counted (so are the events chaining from it, which become orphans in
// turn). Orphans mean the index missed events the seq check could not see
// (typically a replica that was running before any ingestor joined and whose
// replay buffer no longer reaches back); the replica's next restart or cache
// reset, or an operator's reset, rebuilds it.
func (t *Translator) Translate(ctx context.Context, events []kvevents.Event) ([]kvroute.IndexOp, TranslateStats, error) {
	if err := t.fetch(ctx, t.missing(events)); err != nil {
		return nil, TranslateStats{}, err
	}
	ops, st := t.appendOps(make([]kvroute.IndexOp, 0, len(events)*2), events)
	return ops, st, nil
}

// appendOps appends the index operations of events to ops; every hash
// they refer to must be cached or stored earlier in events (see fetch).
func (t *Translator) appendOps(ops []kvroute.IndexOp, events []kvevents.Event) ([]kvroute.IndexOp, TranslateStats) {
	var st TranslateStats
	for i := range events {
		ev := &events[i]
		switch ev.Kind {
		case kvevents.AllBlocksCleared:
			ops = append(ops, kvroute.IndexOp{Kind: kvroute.OpClear})
			st.Clears++
			// The store forgets the replica's engine hashes; so do we, so
			// that a later event cannot chain from a block it lost.
			t.cache = make(map[uint64]cached)

		case kvevents.BlockRemoved:
			if ev.HasGroup && (t.nonFull[ev.GroupIdx] || (len(t.full) > 0 && !t.full[ev.GroupIdx])) {
				st.skip(SkipNonFullAttention, 1)
				continue
			}
			tier := kvroute.TierOf(ev.Medium)
			for _, h := range ev.BlockHashes {
				ops = append(ops, kvroute.IndexOp{Kind: kvroute.OpRemove, EngineHash: h, Tier: tier})
			}
			st.Removed += len(ev.BlockHashes)

		case kvevents.BlockStored:
			if ev.SpecKind != "" && ev.SpecKind != "full_attention" {
				if ev.HasGroup {
					t.nonFull[ev.GroupIdx] = true
				}
				st.skip(SkipNonFullAttention, 1)
				continue
			}
			if ev.HasGroup && ev.SpecKind == "full_attention" {
				t.full[ev.GroupIdx] = true
			}
			tier := kvroute.TierOf(ev.Medium)
			if len(ev.TokenIDs) == 0 {
				ops = t.offload(ops, ev, tier, &st)
				continue
			}
			parent, chainFrom := kvroute.NoParent, kvroute.BlockKey(0)
			if ev.HasParent {
				c, ok := t.cache[ev.Parent]
				if !ok {
					st.Orphans++
					st.skip(SkipOrphan, 1)
					continue
				}
				parent, chainFrom = c.key, c.key
			} else {
				chainFrom = KeySpaceOf(t.model, t.seed, ev).Root()
			}
			t.keys = kvroute.ChainKeys(t.keys[:0], chainFrom, ev.BlockSize, ev.TokenIDs, BlockExtras(ev))
			for j, h := range ev.BlockHashes {
				ops = append(ops, kvroute.IndexOp{Kind: kvroute.OpStore, EngineHash: h, Key: t.keys[j], Parent: parent, Tier: tier})
				t.remember(h, cached{key: t.keys[j], parent: parent})
				parent = t.keys[j]
			}
			st.Stored += len(ev.BlockHashes)
		}
	}
	return ops, st
}

// offload resolves a token-less BlockStored ("these hashes now also live on
// medium") through keys already known; hashes never seen with tokens are
// counted and dropped.
//
// The store derives "held from the root" flags from each op's Parent, so a
// wrong parent would claim a chain the tier does not hold. A block's parent
// comes from when it was keyed with tokens; for a block resolved through the
// store (which keeps no parents) it is the previous block of the event, or
// for the first one the event's parent_block_hash (nil: a prompt's start).
// When none of that is known the block is dropped as unknown too.
func (t *Translator) offload(ops []kvroute.IndexOp, ev *kvevents.Event, tier kvroute.Tier, st *TranslateStats) []kvroute.IndexOp {
	prev, havePrev := kvroute.NoParent, !ev.HasParent
	if ev.HasParent {
		if c, ok := t.cache[ev.Parent]; ok {
			prev, havePrev = c.key, true
		}
	}
	for _, h := range ev.BlockHashes {
		c, ok := t.cache[h]
		parent := c.parent
		if ok && parent == unknownParent {
			parent, ok = prev, havePrev
		}
		if !ok {
			st.skip(SkipUnknownOffload, 1)
			havePrev = false
			continue
		}
		ops = append(ops, kvroute.IndexOp{Kind: kvroute.OpStore, EngineHash: h, Key: c.key, Parent: parent, Tier: tier})
		st.Stored++
		prev, havePrev = c.key, true
	}
	return ops
}

// unknownParent marks a cache entry resolved through the store, which maps
// engine hashes to keys but not to parents. A real key equal to it would
// need a 2^-64 collision, as for NoParent.
const unknownParent = kvroute.BlockKey(1)

// missing returns, once each, the hashes events refer to (parents, and
// the hashes of token-less offload events) that are neither cached nor
// stored with tokens by an earlier event of the same events: what fetch
// must ask the store. The common batch, a prompt's blocks whose parent
// this translator keyed itself, needs nothing and costs no allocation.
func (t *Translator) missing(events []kvevents.Event) []uint64 {
	if t.lookup == nil {
		return nil
	}
	var want []uint64
	// known holds the hashes stored with tokens so far, and those already
	// wanted; it is built on the first miss, since most batches have none.
	var known map[uint64]bool
	need := func(i int, h uint64) {
		if _, ok := t.cache[h]; ok {
			return
		}
		if known == nil {
			known = map[uint64]bool{}
			for j := range events[:i] {
				if ev := &events[j]; ev.Kind == kvevents.BlockStored && len(ev.TokenIDs) > 0 {
					for _, h := range ev.BlockHashes {
						known[h] = true
					}
				}
			}
		}
		if known[h] {
			return
		}
		known[h] = true // ask once
		want = append(want, h)
	}
	for i := range events {
		ev := &events[i]
		if ev.Kind == kvevents.AllBlocksCleared {
			// Later events cannot chain from anything before the clear.
			break
		}
		if ev.Kind != kvevents.BlockStored {
			continue
		}
		if len(ev.TokenIDs) == 0 {
			for _, h := range ev.BlockHashes {
				need(i, h)
			}
		}
		if ev.HasParent {
			need(i, ev.Parent)
		}
		if len(ev.TokenIDs) > 0 && known != nil {
			for _, h := range ev.BlockHashes {
				known[h] = true
			}
		}
	}
	return want
}

// fetch loads the router keys of want (see missing) in one store call.
func (t *Translator) fetch(ctx context.Context, want []uint64) error {
	if len(want) == 0 {
		return nil
	}
	keys, found, err := t.lookup.EngineKeys(ctx, t.model, t.replica, want)
	if err != nil {
		return fmt.Errorf("engine keys: %w", err)
	}
	for i, h := range want {
		if i < len(found) && i < len(keys) && found[i] {
			t.remember(h, cached{key: keys[i], parent: unknownParent})
		}
	}
	return nil
}
