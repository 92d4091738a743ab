package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/redis/go-redis/v9"
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
	return s.ApplyRun(ctx, model, replica, seq, seq, ops)
}

// ApplyRun applies the ops of a replica's consecutive batches first..last,
// concatenated in order, as one atomic Lua call: what Apply does batch by
// batch, but an ingestor with several batches of a replica queued pays one
// round trip for them, and Redis one script call's fixed costs. The run is
// all or nothing: when the replica's applied seq is first or newer, nothing
// changes and Applied is false, even if part of the run is newer. A caller
// that holds the batches apart then applies them one by one, so that
// exactly the stale ones are no-ops.
func (s *Store) ApplyRun(ctx context.Context, model, replica string, first, last int64, ops []kvroute.IndexOp) (kvroute.ApplyResult, error) {
	if first > last {
		return kvroute.ApplyResult{}, fmt.Errorf("store: apply: seqs %d to %d: %w", first, last, kvroute.ErrInvalidInput)
	}
	ck := model + "\x00" + replica
	if c, ok := freshChains(ops); ok {
		slot, err := s.slot(ctx, model, replica, ck)
		if err != nil {
			return kvroute.ApplyResult{}, err
		}
		args := fastArgs(model, replica, first, last, ms(s.now()), slot, ops, c)
		v, err := scriptApplyF.Run(ctx, s.c, []string{metaKey(model, replica)}, args...).Int64Slice()
		if err != nil {
			return kvroute.ApplyResult{}, wrap("apply", err)
		}
		if len(v) < 4 {
			return kvroute.ApplyResult{}, fmt.Errorf("store: apply: unexpected reply %v", v)
		}
		if v[0] >= 0 {
			return kvroute.ApplyResult{Applied: v[0] == 1, Stored: int(v[1]), Removed: int(v[2]), Unknown: int(v[3])}, nil
		}
		// The slot moved or the chains are not fresh: nothing was
		// written, the general path applies the batch.
		s.slots.Delete(ck)
	}
	// apply.lua's arguments: the fixed five, then kind and tier of every op
	// (two bytes each), then every op's engine hash, key and parent as
	// separate arguments (8 bytes each, empty where the kind has none), so
	// that the script reads them without string.sub and passes each run to
	// HMGET whole.
	n := len(ops)
	args := make([]any, 6+3*n)
	args[0], args[1] = prefix(model), replica
	args[2], args[3] = strconv.FormatInt(last, 10), strconv.FormatInt(ms(s.now()), 10)
	args[4] = strconv.FormatInt(first, 10)
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
			args[6+i], args[6+n+i], args[6+2*n+i] = eh, key, par
		case kvroute.OpRemove:
			kinds[2*i] = 'R'
			binary.BigEndian.PutUint64(eh, op.EngineHash)
			args[6+i], args[6+n+i], args[6+2*n+i] = eh, "", ""
		case kvroute.OpClear:
			kinds[2*i] = 'C'
			args[6+i], args[6+n+i], args[6+2*n+i] = "", "", ""
		default:
			return kvroute.ApplyResult{}, fmt.Errorf("store: apply: op kind %d: %w", op.Kind, kvroute.ErrInvalidInput)
		}
	}
	args[5] = kinds
	v, err := scriptApply.Run(ctx, s.c, []string{metaKey(model, replica)}, args...).Int64Slice()
	if err != nil {
		return kvroute.ApplyResult{}, wrap("apply", err)
	}
	if len(v) != 4 && len(v) != 5 {
		return kvroute.ApplyResult{}, fmt.Errorf("store: apply: unexpected reply %v", v)
	}
	if len(v) == 5 && v[4] >= 0 {
		s.slots.Store(ck, int(v[4]))
	}
	return kvroute.ApplyResult{Applied: v[0] == 1, Stored: int(v[1]), Removed: int(v[2]), Unknown: int(v[3])}, nil
}

// slot returns the replica's slot for applyfast.lua: the one cached (ck is
// the cache key), else the one slot.lua reads or allocates.
func (s *Store) slot(ctx context.Context, model, replica, ck string) (int, error) {
	if sl, ok := s.slots.Load(ck); ok {
		return sl.(int), nil
	}
	v, err := scriptSlot.Run(ctx, s.c, []string{loadKey(model)}, prefix(model), replica,
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
	return []any{prefix(model), replica, strconv.FormatInt(last, 10), strconv.FormatInt(now, 10),
		strconv.Itoa(slot), strconv.Itoa(n), strconv.FormatInt(first, 10), blocks, ehashes}
}

// AppliedSeq returns the seq of the last batch applied for the replica; ok
// is false when none has been (or since ResetReplica).
func (s *Store) AppliedSeq(ctx context.Context, model, replica string) (seq int64, ok bool, err error) {
	v, err := s.c.HGet(ctx, metaKey(model, replica), "seq").Result()
	if err == redis.Nil {
		return 0, false, nil
	} else if err != nil {
		return 0, false, wrap("applied seq", err)
	}
	seq, err = strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("store: applied seq: %w", err)
	}
	return seq, true, nil
}

// ResetReplica forgets every event-fed entry of the replica and its applied
// seq, for an engine that restarted (its seq starts over) or a stream the
// ingestor must rebuild. Approximate entries and load are kept.
func (s *Store) ResetReplica(ctx context.Context, model, replica string) error {
	s.slots.Delete(model + "\x00" + replica)
	err := scriptReset.Run(ctx, s.c, []string{metaKey(model, replica)}, prefix(model), replica).Err()
	return wrap("reset replica", err)
}

// EngineKeys maps the replica's engine block hashes to router keys; the
// ingestor chains a BlockStored event's keys from its parent's router key.
func (s *Store) EngineKeys(ctx context.Context, model, replica string, engineHashes []uint64) (keys []kvroute.BlockKey, found []bool, err error) {
	keys = make([]kvroute.BlockKey, len(engineHashes))
	found = make([]bool, len(engineHashes))
	if len(engineHashes) == 0 {
		return keys, found, nil
	}
	fields := make([]string, len(engineHashes))
	for i, h := range engineHashes {
		var f [8]byte
		binary.BigEndian.PutUint64(f[:], h)
		fields[i] = string(f[:6])
	}
	vals, err := s.c.HMGet(ctx, e2rKey(model, replica), fields...).Result()
	if err != nil {
		return nil, nil, wrap("engine keys", err)
	}
	for i, v := range vals {
		str, ok := v.(string)
		if !ok {
			continue
		}
		k, ok, err := e2rRecord(str, uint16(engineHashes[i]))
		if err != nil {
			return nil, nil, fmt.Errorf("store: engine keys: %w", err)
		}
		keys[i], found[i] = k, ok
	}
	return keys, found, nil
}

// e2rRecord finds the key of the engine hash with the last two bytes suf
// in an e2r value: records of suffix (2), key (8), "<gpu>,<host>" and ';'.
func e2rRecord(v string, suf uint16) (kvroute.BlockKey, bool, error) {
	for len(v) > 0 {
		end := strings.IndexByte(v[min(10, len(v)):], ';')
		if len(v) < 14 || end < 0 {
			return 0, false, fmt.Errorf("bad entry %q", v)
		}
		if binary.BigEndian.Uint16([]byte(v[:2])) == suf {
			return kvroute.BlockKey(binary.BigEndian.Uint64([]byte(v[2:10]))), true, nil
		}
		v = v[10+end+1:]
	}
	return 0, false, nil
}

// Lookup returns, for each candidate replica in order, how many leading
// blocks of keys it holds (on GPU, in any tier, approximately) and its load,
// in one round trip. Redis work grows with log2(len(keys)) times the number
// of distinct answers, not with len(keys) nor with the number of candidates
// that share an answer: see lua/lookup.lua.
func (s *Store) Lookup(ctx context.Context, model string, keys []kvroute.BlockKey, replicas []string) ([]kvroute.Overlap, []kvroute.Load, error) {
	n := len(replicas)
	if n == 0 {
		return nil, nil, nil
	}
	// The search runs as a script; the candidates' loads and slots are one
	// plain HMGET in the same pipeline (one round trip): Redis converts a
	// long reply into Lua values far slower than it sends it to a client.
	args := []any{prefix(model), strconv.FormatInt(ms(s.now()), 10), keyBytes(keys)}
	fields := make([]string, 0, 3*n)
	for _, r := range replicas {
		fields = append(fields, r, r+"#s", r+"#i")
	}
	lk := []string{loadKey(model)}
	var res *redis.Cmd
	var lres *redis.SliceCmd
	run := func(sha bool) error {
		_, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			if sha {
				res = scriptLookup.EvalSha(ctx, p, lk, args...)
			} else {
				res = scriptLookup.Eval(ctx, p, lk, args...)
			}
			lres = p.HMGet(ctx, lk[0], fields...)
			return nil
		})
		return err
	}
	err := run(true)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		err = run(false)
	}
	if err != nil {
		return nil, nil, wrap("lookup", err)
	}
	v, err := res.Slice()
	if err != nil {
		return nil, nil, wrap("lookup", err)
	}
	lv, err := lres.Result()
	if err != nil {
		return nil, nil, wrap("lookup", err)
	}
	if len(v) != 2 {
		return nil, nil, fmt.Errorf("store: lookup: unexpected reply of %d values", len(v))
	}
	segs, _ := v[0].([]any)
	asegs, _ := v[1].([]any)
	if len(lv) != 3*n {
		return nil, nil, fmt.Errorf("store: lookup: short reply (%d load fields for %d replicas)", len(lv), n)
	}
	ov := make([]kvroute.Overlap, n)
	loads := make([]kvroute.Load, n)
	for i := range ov {
		if loads[i], err = parseLoad(lv[3*i], lv[3*i+1]); err != nil {
			return nil, nil, fmt.Errorf("store: lookup: %s: %w", replicas[i], err)
		}
		str, ok := lv[3*i+2].(string)
		if !ok {
			continue // never stored nor recorded: holds nothing
		}
		slot, err := strconv.Atoi(str)
		if err != nil {
			return nil, nil, fmt.Errorf("store: lookup: %s: bad slot %q", replicas[i], str)
		}
		ov[i] = overlapOf(slot, segs, asegs)
	}
	return ov, loads, nil
}

// overlapOf decodes one slot's answer from lookup.lua's segments: each is
// the last position of a run and the run's value, in no particular order;
// sets only shrink along the chain, so the largest position whose set names
// the slot gives its match length.
func overlapOf(slot int, segs, asegs []any) kvroute.Overlap {
	var o kvroute.Overlap
	idx, mask := slot/8, byte(1)<<(slot%8)
	in := func(bm string) bool { return idx < len(bm) && bm[idx]&mask != 0 }
	for j := 0; j+1 < len(segs); j += 2 {
		pos := asInt(segs[j])
		v, _ := segs[j+1].(string)
		if len(v) < 2 || 2+int(v[0]) > len(v) || 2+int(v[0])+int(v[1+int(v[0])]) > len(v) {
			continue
		}
		rg := v[1 : 1+int(v[0])]
		rest := v[1+int(v[0]):]
		ra := rest[1 : 1+int(rest[0])]
		if in(rg) {
			o.GPU = max(o.GPU, pos+1)
		}
		if in(ra) {
			o.Any = max(o.Any, pos+1)
		}
	}
	hi, lo := byte(slot>>8), byte(slot)
	for j := 0; j+1 < len(asegs); j += 2 {
		v, _ := asegs[j+1].(string)
		for k := 0; k+1 < len(v); k += 2 {
			if v[k] == hi && v[k+1] == lo {
				o.Approx = max(o.Approx, asInt(asegs[j])+1)
				break
			}
		}
	}
	return o
}

func asInt(v any) int {
	i, _ := v.(int64)
	return int(i)
}

// RecordApprox records that keys were routed to replica, for replicas that
// publish no events: Lookup then reports them as Approx until ApproxTTL
// passes. Approximate entries never touch event-fed ones.
func (s *Store) RecordApprox(ctx context.Context, model, replica string, keys []kvroute.BlockKey) error {
	if len(keys) == 0 {
		return nil
	}
	now := s.now()
	args := []any{prefix(model), replica, strconv.FormatInt(ms(now), 10),
		strconv.FormatInt(ms(now.Add(s.approxTTL)), 10), keyBytes(keys)}
	err := scriptApprox.Run(ctx, s.c, []string{axKey(model)}, args...).Err()
	return wrap("record approx", err)
}

// sweepApproxBatch bounds the keys one sweep_approx script visits.
const sweepApproxBatch = 1000

// SweepApprox drops the model's expired approximate entries and returns how
// many (replica, block) entries it dropped. Lookup never counts an expired
// entry, so this only bounds memory; SweepExpired calls it too.
func (s *Store) SweepApprox(ctx context.Context, model string) (int, error) {
	total := 0
	now := strconv.FormatInt(ms(s.now()), 10)
	for {
		v, err := scriptSweepAx.Run(ctx, s.c, []string{axKey(model)}, prefix(model), now, sweepApproxBatch).Int64Slice()
		if err != nil {
			return total, wrap("sweep approx", err)
		}
		if len(v) != 2 {
			return total, fmt.Errorf("store: sweep approx: unexpected reply %v", v)
		}
		total += int(v[0])
		if v[1] == 0 {
			return total, nil
		}
	}
}

// PurgeReplica removes everything kept about the replica under model: index
// and approximate entries, meta, load and outstanding leases.
func (s *Store) PurgeReplica(ctx context.Context, model, replica string) error {
	s.slots.Delete(model + "\x00" + replica)
	ids, err := scriptPurge.Run(ctx, s.c, []string{metaKey(model, replica)}, prefix(model), replica,
		strconv.FormatInt(ms(s.now()), 10)).StringSlice()
	if err != nil {
		return wrap("purge replica", err)
	}
	if len(ids) > 0 {
		if err := s.c.HDel(ctx, keyRequests, ids...).Err(); err != nil {
			return wrap("purge replica", err)
		}
	}
	return nil
}

// Stats returns the replica's index statistics; a replica never applied
// has zero stats and no error.
func (s *Store) Stats(ctx context.Context, model, replica string) (kvroute.ReplicaStats, error) {
	v, err := s.c.HMGet(ctx, metaKey(model, replica), "seq", "at", "n").Result()
	if err != nil {
		return kvroute.ReplicaStats{}, wrap("stats", err)
	}
	var st kvroute.ReplicaStats
	if str, ok := v[0].(string); ok {
		if st.AppliedSeq, err = strconv.ParseInt(str, 10, 64); err != nil {
			return kvroute.ReplicaStats{}, fmt.Errorf("store: stats: seq: %w", err)
		}
		st.HasSeq = true
	}
	if str, ok := v[1].(string); ok {
		at, err := strconv.ParseInt(str, 10, 64)
		if err != nil {
			return kvroute.ReplicaStats{}, fmt.Errorf("store: stats: at: %w", err)
		}
		st.LastApplied = time.UnixMilli(at)
	}
	if str, ok := v[2].(string); ok {
		if st.Blocks, err = strconv.Atoi(str); err != nil {
			return kvroute.ReplicaStats{}, fmt.Errorf("store: stats: blocks: %w", err)
		}
	}
	return st, nil
}
