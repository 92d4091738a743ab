package store

import (
	"context"
	"encoding/binary"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvroute/kvroute"
	"github.com/redis/go-redis/v9"
)

// The hinted lookup without a script. With hints, lookup.lua's first level
// (both ends of the chain and every hinted run end and the block after it)
// usually proves every run, and then the script's work is one HMGET and
// turning its values into segments. That HMGET can come from the pod
// instead, pipelined with the loads read: Redis then looks up a few dozen
// fields instead of running a script with a 16 KB argument, and the pod
// checks the proof itself, the same way lookup.lua does. When the hints do
// not prove every run (the chain grew, a holder moved), the script runs as
// before; the plain read was one wasted round trip, so a Store whose plain
// reads mostly fail stops trying them for a while.

// fastLookup decides whether to try the plain read, from how often it
// proved the whole chain lately.
type fastLookup struct {
	mu          sync.Mutex
	tries, hits int
	off         bool // the last window mostly failed
	skipped     int  // lookups not tried since off
	// allTries and allHits count every plain read, for tests.
	allTries, allHits atomic.Int64
}

const (
	fastWindow = 64 // lookups per verdict
	fastRetry  = 16 // while off, one lookup in this many still tries
)

func (f *fastLookup) try() bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.off {
		f.skipped++
		if f.skipped%fastRetry != 0 {
			return false
		}
	}
	return true
}

func (f *fastLookup) result(hit bool) {
	f.allTries.Add(1)
	if hit {
		f.allHits.Add(1)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.tries++
	if hit {
		f.hits++
	}
	if f.off && hit {
		// A retry that proves the chain: judge afresh.
		f.off, f.tries, f.hits = false, 1, 1
		return
	}
	if f.tries >= fastWindow {
		f.off, f.tries, f.hits, f.skipped = 2*f.hits < f.tries, 0, 0, 0
	}
}

// lookupPlain reads, with plain HMGETs, the hinted probes of the index and
// of the approximate entries and the load fields; ok is false when the
// hints do not prove every run (the caller runs the script).
func (s *Store) lookupPlain(ctx context.Context, model string, keys []kvroute.BlockKey, hints []int32, fields []string) (segs, asegs, lv []any, ok bool, err error) {
	last := len(keys) - 1
	probes := make([]int, 0, len(hints)+2)
	if len(keys) <= hintStride {
		for p := range keys {
			probes = append(probes, p)
		}
	} else {
		probes = append(probes, 0)
		for _, h := range hints {
			if h > 0 && int(h) < last {
				probes = append(probes, int(h))
			}
		}
		probes = append(probes, last)
		slices.Sort(probes)
		probes = slices.Compact(probes)
	}
	pf := make([]string, len(probes))
	for i, p := range probes {
		pf[i] = keyField(keys[p])
	}
	var blk, ax, lres *redis.SliceCmd
	// A model this pod has not read slots of goes to the primary: a
	// replica without the model's data (restarted empty) could not be
	// told from a model without slots.
	if err = s.readVia(ctx, model, s.slotc.seen(model), func() []redis.Cmder {
		blk, ax, lres = hmget(ctx, blkKey(model), pf), hmget(ctx, axKey(model), pf), hmget(ctx, loadKey(model), fields)
		return []redis.Cmder{blk, ax, lres}
	}, func() error {
		if v := lres.Val(); len(v) > 0 && v[len(v)-1] == nil && s.slotc.seen(model) {
			return errReplicaEmpty
		}
		return nil
	}); err != nil {
		return nil, nil, nil, false, wrap("lookup", err)
	}
	bv, av := blk.Val(), ax.Val()
	if len(bv) != len(probes) || len(av) != len(probes) {
		return nil, nil, nil, false, nil
	}
	vals := make([]string, len(probes))
	for i, v := range bv {
		var good bool
		if vals[i], good = eventValue(v); !good {
			return nil, nil, nil, false, nil // not a value this code knows: the script decides
		}
	}
	segs, proved := provedSegments(probes, vals)
	if !proved {
		return nil, nil, nil, false, nil
	}
	// Approximate entries, at the same probes: along a chain they only
	// shrink too (none at the first block means none anywhere).
	now := ms(s.now())
	for i, v := range av {
		vals[i] = axValue(v, now)
	}
	if vals[0] != "" {
		if asegs, proved = provedSegments(probes, vals); !proved {
			return nil, nil, nil, false, nil
		}
	}
	return segs, asegs, lres.Val(), true, nil
}

// provedSegments is lookup.lua's first level: between consecutive probes
// with equal values every position holds that value; a change between
// neighbours ends a run. It returns the segments (each run's last position
// and its value, for non-empty values) and whether every stretch between
// probes was proved.
func provedSegments(probes []int, vals []string) ([]any, bool) {
	var segs []any
	for i := 0; i+1 < len(probes); i++ {
		if vals[i] == vals[i+1] {
			continue
		}
		if probes[i+1] > probes[i]+1 {
			return nil, false
		}
		if vals[i] != "" {
			segs = append(segs, int64(probes[i]), vals[i])
		}
	}
	if v := vals[len(vals)-1]; v != "" {
		segs = append(segs, int64(probes[len(probes)-1]), v)
	}
	return segs, true
}

// keyField is a block key as a field of the blk and ax hashes: its 8
// big-endian bytes.
func keyField(k kvroute.BlockKey) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(k))
	return string(b[:])
}

// eventValue is lookup.lua's evVal: a block entry's holder bitmaps as
// "RG|RA" (each a length byte and the bitmap), empty when nothing holds
// the block. ok is false for an entry of a layout it does not know.
func eventValue(v any) (string, bool) {
	str, isStr := v.(string)
	if v == nil {
		return "", true
	}
	if !isStr || len(str) < 18 {
		return "", false
	}
	a := int(str[17])
	if str[16] >= 2 {
		// One bitmap for all four: RG|RA is it twice.
		if a == 0 {
			return "", true
		}
		if 18+a > len(str) {
			return "", false
		}
		g := str[17 : 18+a]
		return g + g, true
	}
	if 18+a >= len(str) {
		return "", false
	}
	b := int(str[18+a])
	if a+b == 0 {
		return "", true
	}
	if 19+a+b > len(str) {
		return "", false
	}
	return str[17 : 19+a+b], true
}

// axValue is lookup.lua's axVal: the 2-byte slots of an approximate entry
// whose expiry (6 big-endian bytes of milliseconds after each slot) is
// after now.
func axValue(v any, now int64) string {
	str, _ := v.(string)
	var out []byte
	for i := 0; i+8 <= len(str); i += 8 {
		var exp int64
		for _, c := range []byte(str[i+2 : i+8]) {
			exp = exp<<8 | int64(c)
		}
		if exp > now {
			out = append(out, str[i], str[i+1])
		}
	}
	return string(out)
}
