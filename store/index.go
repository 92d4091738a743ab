package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
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

// ApplyResult says what one Apply did. Applied is false when the batch's
// seq was not newer than the replica's applied seq and nothing changed.
type ApplyResult struct {
	Applied bool
	Stored  int
	Removed int
	// Unknown counts removals of blocks the replica was not known to hold
	// (an engine hash never stored, or a tier with no reference left).
	Unknown int
}

// Apply applies one batch of index operations of one replica in one atomic
// Lua call. Batches are idempotent by seq: a batch whose seq is not newer
// than the last applied one is a no-op, so a replay may overlap what was
// already applied.
func (s *Store) Apply(ctx context.Context, model, replica string, seq int64, ops []kvroute.IndexOp) (ApplyResult, error) {
	// apply.lua's arguments: the fixed four, then kind and tier of every op
	// (two bytes each), then every op's engine hash, key and parent as
	// separate arguments (8 bytes each, empty where the kind has none), so
	// that the script reads them without string.sub and passes each run to
	// HMGET whole.
	n := len(ops)
	args := make([]any, 5+3*n)
	args[0], args[1] = prefix(model), replica
	args[2], args[3] = strconv.FormatInt(seq, 10), strconv.FormatInt(ms(s.now()), 10)
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
			return ApplyResult{}, fmt.Errorf("store: apply: op kind %d: %w", op.Kind, kvroute.ErrInvalidInput)
		}
	}
	args[4] = kinds
	v, err := scriptApply.Run(ctx, s.c, []string{metaKey(model, replica)}, args...).Int64Slice()
	if err != nil {
		return ApplyResult{}, wrap("apply", err)
	}
	if len(v) != 4 {
		return ApplyResult{}, fmt.Errorf("store: apply: unexpected reply %v", v)
	}
	return ApplyResult{Applied: v[0] == 1, Stored: int(v[1]), Removed: int(v[2]), Unknown: int(v[3])}, nil
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
		fields[i] = string(f[:])
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
		if len(str) < 8 {
			return nil, nil, fmt.Errorf("store: engine keys: bad entry %q", str)
		}
		keys[i], found[i] = kvroute.BlockKey(binary.BigEndian.Uint64([]byte(str[:8]))), true
	}
	return keys, found, nil
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

// ReplicaStats is what the store knows about one replica's index.
type ReplicaStats struct {
	// Blocks is the number of distinct blocks held (any tier).
	Blocks      int
	AppliedSeq  int64
	HasSeq      bool
	LastApplied time.Time
}

// Stats returns the replica's index statistics; a replica never applied
// has zero stats and no error.
func (s *Store) Stats(ctx context.Context, model, replica string) (ReplicaStats, error) {
	v, err := s.c.HMGet(ctx, metaKey(model, replica), "seq", "at", "n").Result()
	if err != nil {
		return ReplicaStats{}, wrap("stats", err)
	}
	var st ReplicaStats
	if str, ok := v[0].(string); ok {
		if st.AppliedSeq, err = strconv.ParseInt(str, 10, 64); err != nil {
			return ReplicaStats{}, fmt.Errorf("store: stats: seq: %w", err)
		}
		st.HasSeq = true
	}
	if str, ok := v[1].(string); ok {
		at, err := strconv.ParseInt(str, 10, 64)
		if err != nil {
			return ReplicaStats{}, fmt.Errorf("store: stats: at: %w", err)
		}
		st.LastApplied = time.UnixMilli(at)
	}
	if str, ok := v[2].(string); ok {
		if st.Blocks, err = strconv.Atoi(str); err != nil {
			return ReplicaStats{}, fmt.Errorf("store: stats: blocks: %w", err)
		}
	}
	return st, nil
}
