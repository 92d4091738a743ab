package store

import (
	"context"
	"encoding/binary"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/redis/go-redis/v9"
)

// AppliedSeq returns the seq of the last batch applied for the replica; ok
// is false when none has been (or since ResetReplica).
func (s *Store) AppliedSeq(ctx context.Context, model, replica string) (seq int64, ok bool, err error) {
	return s.metaInt(ctx, model, replica, "seq", "applied seq")
}

// HistoryStart returns the first seq of the run that began the replica's
// history in the store: the run that found no applied seq (its first ever,
// or the first after a reset or a loss; see kvroute.ApplyResult.NoPrior).
// ok is false while the store holds no history for it. A follower whose
// apply failed asks it to learn whether its own run began a new history,
// when the reply that would have said so was lost.
func (s *Store) HistoryStart(ctx context.Context, model, replica string) (from int64, ok bool, err error) {
	return s.metaInt(ctx, model, replica, "from", "history start")
}

// metaInt reads one integer field of the replica's meta hash; ok is false
// when the field is absent. op prefixes its errors.
func (s *Store) metaInt(ctx context.Context, model, replica, field, op string) (int64, bool, error) {
	v, err := s.c.HGet(ctx, metaKey(model, replica), field).Result()
	if err == redis.Nil {
		return 0, false, nil
	} else if err != nil {
		return 0, false, wrap(op, err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("store: %s: %w", op, err)
	}
	return n, true, nil
}

// ResetReplica forgets every event-fed entry of the replica and its applied
// seq, for an engine that restarted (its seq starts over) or a stream the
// ingestor must rebuild. Approximate entries and load are kept, and so is
// the replica's writer. A writer other than the one the store holds for the
// replica (see ClaimReplica) is refused with kvroute.ErrFenced, nothing
// changed; an empty writer is not fenced.
func (s *Store) ResetReplica(ctx context.Context, model, replica, writer string) error {
	s.slots.Delete(model + "\x00" + replica)
	n, err := scriptReset.Run(ctx, s.c, libKeys(model, metaKey(model, replica), e2rKey(model, replica)), replica, writer).Int()
	if err == nil && n == fencedReply {
		return fmt.Errorf("store: reset replica %s: %w", replica, kvroute.ErrFenced)
	}
	return wrap("reset replica", err)
}

// fencedReply is what apply.lua, applyfast.lua and reset.lua answer a writer
// that another holds the replica from (lua/fence.lua).
const fencedReply = -2

// ClaimReplica makes writer the one the store lets write the replica's
// index (lua/fence.lua): from now on a write by any other is refused with
// kvroute.ErrFenced. An ingestor claims a replica when it starts following
// it under the replica's ownership lease, so that the former owner, which
// may not have noticed yet, can neither reset nor extend the history the
// new one continues.
func (s *Store) ClaimReplica(ctx context.Context, model, replica, writer string) error {
	if writer == "" {
		return fmt.Errorf("store: claim replica: empty writer: %w", kvroute.ErrInvalidInput)
	}
	return wrap("claim replica", s.c.HSet(ctx, metaKey(model, replica), "w", writer).Err())
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

// PurgeReplica removes everything kept about the replica under model: index
// and approximate entries, meta, load and outstanding leases.
func (s *Store) PurgeReplica(ctx context.Context, model, replica string) error {
	s.slots.Delete(model + "\x00" + replica)
	keys := libKeys(model, metaKey(model, replica), e2rKey(model, replica), lbKey(model), leasesKey(model))
	err := scriptPurge.Run(ctx, s.c, keys, replica, strconv.FormatInt(ms(s.now()), 10)).Err()
	return wrap("purge replica", err)
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
