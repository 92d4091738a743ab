package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"

	"github.com/kvroute/kvroute"
)

// keyBytes packs keys as apply.lua and lookup.lua read them: 8 big-endian
// bytes each, one string.
func keyBytes(keys []kvroute.BlockKey) []byte {
	b := make([]byte, 8*len(keys))
	for i, k := range keys {
		binary.BigEndian.PutUint64(b[8*i:], uint64(k))
	}
	return b
}

// Apply applies one batch of index operations of one replica in one atomic
// Lua call. Batches are idempotent by seq: a batch whose seq is not newer
// than the last applied one is a no-op, so a replay may overlap what was
// already applied.
//
// A batch made only of fresh chains (the blocks of new prompts) goes to
// applyfast.lua with every block entry and engine-hash record computed here
// for the replica's slot (cached; the first time asked of slot.lua, which
// allocates it): the script only checks that the slot, blocks and engine
// hashes are as assumed (else it changes nothing and the batch takes
// apply.lua's general path, one more round trip) and writes them with one
// HSET per hash.
func (s *Store) Apply(ctx context.Context, model, replica string, seq int64, ops []kvroute.IndexOp) (kvroute.ApplyResult, error) {
	return s.ApplyRun(ctx, model, replica, "", seq, seq, ops)
}

// ApplyRun applies the ops of a replica's consecutive batches first..last,
// concatenated in order, as one atomic Lua call: what Apply does batch by
// batch, but an ingestor with several batches of a replica queued pays one
// round trip for them, and Redis one script call's fixed costs. The run is
// all or nothing: when the replica's applied seq is first or newer, nothing
// changes and Applied is false, even if part of the run is newer. A caller
// that holds the batches apart then applies them one by one, so that
// exactly the stale ones are no-ops.
//
// writer is the ingestor applying the run: a writer other than the one the
// store holds for the replica (see ClaimReplica) is refused with
// kvroute.ErrFenced, nothing changed, and a replica with none is claimed by
// the run. An empty writer is not fenced (Apply).
func (s *Store) ApplyRun(ctx context.Context, model, replica, writer string, first, last int64, ops []kvroute.IndexOp) (kvroute.ApplyResult, error) {
	if first > last {
		return kvroute.ApplyResult{}, fmt.Errorf("store: apply: seqs %d to %d: %w", first, last, kvroute.ErrInvalidInput)
	}
	ck := model + "\x00" + replica
	if c, ok := freshChains(ops); ok {
		if res, done, err := s.applyFast(ctx, model, replica, writer, ck, first, last, ops, c); done || err != nil {
			return res, err
		}
	}
	// apply.lua's arguments: the fixed four and the kinds, then kind and tier of every op
	// (two bytes each), then every op's engine hash, key and parent as
	// separate arguments (8 bytes each, empty where the kind has none), so
	// that the script reads them without string.sub and passes each run to
	// HMGET whole.
	n := len(ops)
	args := make([]any, 6+3*n)
	args[5+3*n] = writer
	args[0] = replica
	args[1], args[2] = strconv.FormatInt(last, 10), strconv.FormatInt(ms(s.now()), 10)
	args[3] = strconv.FormatInt(first, 10)
	kinds := make([]byte, 2*n)
	b8 := make([]byte, 24*n)
	for i, op := range ops {
		tier := byte(0)
		if op.Tier != kvroute.TierGPU {
			tier = 1
		}
		kinds[2*i+1] = tier
		eh, key, par := b8[24*i:24*i+8], b8[24*i+8:24*i+16], b8[24*i+16:24*i+24]
		switch op.Kind {
		case kvroute.OpStore:
			kinds[2*i] = 'S'
			binary.BigEndian.PutUint64(eh, op.EngineHash)
			binary.BigEndian.PutUint64(key, uint64(op.Key))
			binary.BigEndian.PutUint64(par, uint64(op.Parent))
			args[5+i], args[5+n+i], args[5+2*n+i] = eh, key, par
		case kvroute.OpRemove:
			kinds[2*i] = 'R'
			binary.BigEndian.PutUint64(eh, op.EngineHash)
			args[5+i], args[5+n+i], args[5+2*n+i] = eh, "", ""
		case kvroute.OpClear:
			kinds[2*i] = 'C'
			args[5+i], args[5+n+i], args[5+2*n+i] = "", "", ""
		default:
			return kvroute.ApplyResult{}, fmt.Errorf("store: apply: op kind %d: %w", op.Kind, kvroute.ErrInvalidInput)
		}
	}
	args[4] = kinds
	v, err := scriptApply.Run(ctx, s.c, libKeys(model, metaKey(model, replica), e2rKey(model, replica)), args...).Int64Slice()
	if err != nil {
		return kvroute.ApplyResult{}, wrap("apply", err)
	}
	if len(v) != 4 && len(v) != 5 && len(v) != 7 {
		return kvroute.ApplyResult{}, fmt.Errorf("store: apply: unexpected reply %v", v)
	}
	if err := refused(replica, first, v); err != nil {
		return kvroute.ApplyResult{}, err
	}
	if len(v) >= 5 && v[4] >= 0 {
		s.slots.Store(ck, int(v[4]))
	}
	s.countApplied(ctx, v)
	return applyResult(v), nil
}

// applyFast tries a run of fresh chains through applyfast.lua; done is
// false when the script wrote nothing because the slot moved or the chains
// are not fresh after all, and the general path must apply the run.
func (s *Store) applyFast(ctx context.Context, model, replica, writer, ck string, first, last int64, ops []kvroute.IndexOp, c chains) (_ kvroute.ApplyResult, done bool, _ error) {
	slot, err := s.slot(ctx, model, replica, ck)
	if err != nil {
		return kvroute.ApplyResult{}, false, err
	}
	args := append(fastArgs(model, replica, first, last, ms(s.now()), slot, ops, c), writer)
	keys := []string{metaKey(model, replica), loadKey(model), blkKey(model), e2rKey(model, replica)}
	v, err := scriptApplyF.Run(ctx, s.c, keys, args...).Int64Slice()
	if err != nil {
		return kvroute.ApplyResult{}, false, wrap("apply", err)
	}
	if len(v) < 4 {
		return kvroute.ApplyResult{}, false, fmt.Errorf("store: apply: unexpected reply %v", v)
	}
	if err := refused(replica, first, v); err != nil {
		return kvroute.ApplyResult{}, false, err
	}
	if v[0] < 0 {
		s.slots.Delete(ck)
		return kvroute.ApplyResult{}, false, nil
	}
	s.countApplied(ctx, v)
	return applyResult(v), true, nil
}

// behindReply is apply.lua's and applyfast.lua's answer to a run that does
// not follow the replica's applied seq, which is older (the store lost
// acknowledged batches); the reply's second value is that seq.
const behindReply = -3

// refused turns a script's refusal of a run from first into its error:
// fenced, or the store behind the follower; nil for any other reply.
func refused(replica string, first int64, v []int64) error {
	switch v[0] {
	case fencedReply:
		return fmt.Errorf("store: apply %s: %w", replica, kvroute.ErrFenced)
	case behindReply:
		return fmt.Errorf("store: apply %s from seq %d: the store holds seq %d: %w", replica, first, v[1], kvroute.ErrStoreBehind)
	}
	return nil
}

// countApplied counts the predictions an applied batch confirmed and
// ended (the reply's sixth and seventh values).
func (s *Store) countApplied(ctx context.Context, v []int64) {
	if len(v) >= 7 {
		s.countPredictions(ctx, PredictConfirmed, v[5])
		s.countPredictions(ctx, PredictEvicted, v[6])
	}
}

// applyResult reads apply.lua's and applyfast.lua's reply: status 1
// applied over an applied seq, 2 applied with none before, 0 stale.
func applyResult(v []int64) kvroute.ApplyResult {
	return kvroute.ApplyResult{Applied: v[0] >= 1, NoPrior: v[0] == 2, Stored: int(v[1]), Removed: int(v[2]), Unknown: int(v[3])}
}

// slot returns the replica's slot for applyfast.lua: the one cached (ck is
// the cache key), else the one slot.lua reads or allocates.
func (s *Store) slot(ctx context.Context, model, replica, ck string) (int, error) {
	if sl, ok := s.slots.Load(ck); ok {
		return sl.(int), nil
	}
	v, err := scriptSlot.Run(ctx, s.c, libKeys(model), replica,
		strconv.FormatInt(ms(s.now()), 10)).Int()
	if err != nil {
		return 0, wrap("apply", err)
	}
	s.slots.Store(ck, v)
	return v, nil
}

// chains is the shape of a run of fresh chains: for each op, the index + 1
// of the op storing its child (0: none), and whether it is rooted (bit 0:
// RG, bit 1: RA) for its replica, as its parent is.
type chains struct {
	child  []int32
	rooted []byte
}

// freshChains reports whether every op of the run stores a block of a
// fresh chain: distinct keys and engine hashes, each parent NoParent or an
// earlier op's key, no key parent of two ops, no two engine hashes under
// one e2r field (6-byte prefix). Such a run can take applyfast.lua.
func freshChains(ops []kvroute.IndexOp) (chains, bool) {
	n := len(ops)
	if n == 0 {
		return chains{}, false
	}
	// Distinct keys and e2r fields, found by sorting: for a run of a
	// thousand ops, two maps cost more than the rest of the Go side.
	seen := make([]uint64, 2*n)
	for i, op := range ops {
		if op.Kind != kvroute.OpStore || op.Key == kvroute.NoParent {
			return chains{}, false
		}
		seen[i], seen[n+i] = uint64(op.Key), op.EngineHash>>16
	}
	if hasDup(seen[:n]) || hasDup(seen[n:]) {
		return chains{}, false
	}
	c := chains{child: make([]int32, n), rooted: make([]byte, n)}
	var idx map[kvroute.BlockKey]int // key -> op index, when a parent is not the op before
	for i, op := range ops {
		pr := byte(3)
		if op.Parent != kvroute.NoParent {
			p := i - 1
			if p < 0 || ops[p].Key != op.Parent {
				if idx == nil {
					idx = make(map[kvroute.BlockKey]int, n)
					for j, o := range ops {
						idx[o.Key] = j
					}
				}
				var ok bool
				if p, ok = idx[op.Parent]; !ok || p >= i {
					return chains{}, false
				}
			}
			if c.child[p] != 0 {
				return chains{}, false
			}
			c.child[p] = int32(i + 1)
			pr = c.rooted[p]
		}
		if op.Tier != kvroute.TierGPU {
			pr &^= 1
		}
		c.rooted[i] = pr
	}
	return c, true
}

// hasDup reports whether vs holds a value twice; it sorts vs.
func hasDup(vs []uint64) bool {
	slices.Sort(vs)
	for i := 1; i < len(vs); i++ {
		if vs[i] == vs[i-1] {
			return true
		}
	}
	return false
}

// fastArgs returns applyfast.lua's arguments for a run of fresh chains of
// shape c: each entry and engine-hash value computed for R's slot, as
// apply.lua's general path would leave it if every block and engine hash is
// new (which the script verifies).
func fastArgs(model, replica string, first, last, now int64, slot int, ops []kvroute.IndexOp, c chains) []any {
	n := len(ops)
	bm := make([]byte, slot/8+1)
	bm[slot/8] = 1 << (slot % 8)
	lb := byte(len(bm))
	// blocks: key (8) | entry length (2) | entry: parent, first child, shape
	// byte and one or four bitmaps. engine hashes: field (6) | record: the
	// engine hash's last 2 bytes, the key and the refcounts.
	blocks := make([]byte, 0, n*(8+2+17+4*(1+len(bm))))
	ehashes := make([]byte, 0, n*20)
	for i, op := range ops {
		blocks = binary.BigEndian.AppendUint64(blocks, uint64(op.Key))
		blocks = append(blocks, 0, 0)
		st := len(blocks)
		blocks = binary.BigEndian.AppendUint64(blocks, uint64(op.Parent))
		fc := uint64(0)
		if ch := c.child[i]; ch != 0 {
			fc = uint64(ops[ch-1].Key)
		}
		blocks = binary.BigEndian.AppendUint64(blocks, fc)
		gpu := op.Tier == kvroute.TierGPU
		if gpu && c.rooted[i] == 3 {
			// Held and rooted on GPU: the four bitmaps are one (shape 2).
			blocks = append(blocks, 2, lb)
			blocks = append(blocks, bm...)
		} else {
			blocks = append(blocks, 0)
			for _, on := range [4]bool{c.rooted[i]&1 != 0, c.rooted[i]&2 != 0, gpu, true} {
				if on {
					blocks = append(blocks, lb)
					blocks = append(blocks, bm...)
				} else {
					blocks = append(blocks, 0)
				}
			}
		}
		binary.BigEndian.PutUint16(blocks[st-2:], uint16(len(blocks)-st))
		ehashes = binary.BigEndian.AppendUint64(ehashes, op.EngineHash)
		ehashes = binary.BigEndian.AppendUint64(ehashes, uint64(op.Key))
		if gpu {
			ehashes = append(ehashes, "1,0;"...)
		} else {
			ehashes = append(ehashes, "0,1;"...)
		}
	}
	return []any{replica, strconv.FormatInt(last, 10), strconv.FormatInt(now, 10),
		strconv.Itoa(slot), strconv.Itoa(n), strconv.FormatInt(first, 10), blocks, ehashes}
}
