package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/redis/go-redis/v9"
)

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
	args := make([]any, 0, 4+5*len(ops))
	args = append(args, prefix(model), replica, strconv.FormatInt(seq, 10), strconv.FormatInt(ms(s.now()), 10))
	for _, op := range ops {
		tier := "0"
		if op.Tier != kvroute.TierGPU {
			tier = "1"
		}
		switch op.Kind {
		case kvroute.OpStore:
			args = append(args, "S", strconv.FormatUint(op.EngineHash, 10), op.Key.String(), op.Parent.String(), tier)
		case kvroute.OpRemove:
			args = append(args, "R", strconv.FormatUint(op.EngineHash, 10), "0", "0", tier)
		case kvroute.OpClear:
			args = append(args, "C", "0", "0", "0", "0")
		default:
			return ApplyResult{}, fmt.Errorf("store: apply: op kind %d: %w", op.Kind, kvroute.ErrInvalidInput)
		}
	}
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
		fields[i] = strconv.FormatUint(h, 10)
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
		k, err := kvroute.ParseBlockKey(str)
		if err != nil {
			return nil, nil, fmt.Errorf("store: engine keys: %w", err)
		}
		keys[i], found[i] = k, true
	}
	return keys, found, nil
}

// Lookup returns, for each candidate replica in order, how many leading
// blocks of keys it holds (on GPU, in any tier, approximately) and its load,
// in one round trip. Redis work grows with log2(len(keys)) per distinct
// answer, not with len(keys): see lua/lookup.lua.
func (s *Store) Lookup(ctx context.Context, model string, keys []kvroute.BlockKey, replicas []string) ([]kvroute.Overlap, []kvroute.Load, error) {
	n := len(replicas)
	if n == 0 {
		return nil, nil, nil
	}
	args := make([]any, 0, 3+n+len(keys))
	args = append(args, prefix(model), strconv.FormatInt(ms(s.now()), 10), strconv.Itoa(n))
	for _, r := range replicas {
		args = append(args, r)
	}
	for _, k := range keys {
		args = append(args, k.String())
	}
	v, err := scriptLookup.Run(ctx, s.c, []string{loadKey(model)}, args...).Slice()
	if err != nil {
		return nil, nil, wrap("lookup", err)
	}
	if len(v) < 3*n {
		return nil, nil, fmt.Errorf("store: lookup: short reply (%d values for %d replicas)", len(v), n)
	}
	ov := make([]kvroute.Overlap, n)
	for i := range ov {
		ov[i] = kvroute.Overlap{GPU: asInt(v[i]), Any: asInt(v[n+i]), Approx: asInt(v[2*n+i])}
	}
	loads := make([]kvroute.Load, n)
	for i := range loads {
		// Lua's nil truncates a reply, so missing loads may be cut off.
		var booked, scraped any
		if j := 3*n + 2*i; j < len(v) {
			booked = v[j]
		}
		if j := 3*n + 2*i + 1; j < len(v) {
			scraped = v[j]
		}
		if loads[i], err = parseLoad(booked, scraped); err != nil {
			return nil, nil, fmt.Errorf("store: lookup: %s: %w", replicas[i], err)
		}
	}
	return ov, loads, nil
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
	args := make([]any, 0, 5+len(keys))
	args = append(args, prefix(model), replica, strconv.FormatInt(ms(now), 10),
		strconv.FormatInt(ms(now.Add(s.approxTTL)), 10), strconv.FormatInt(s.approxTTL.Milliseconds(), 10))
	for _, k := range keys {
		args = append(args, k.String())
	}
	err := scriptApprox.Run(ctx, s.c, []string{akKey(model, replica)}, args...).Err()
	return wrap("record approx", err)
}

// PurgeReplica removes everything kept about the replica under model: index
// and approximate entries, meta, load and outstanding leases.
func (s *Store) PurgeReplica(ctx context.Context, model, replica string) error {
	ids, err := scriptPurge.Run(ctx, s.c, []string{metaKey(model, replica)}, prefix(model), replica).StringSlice()
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
