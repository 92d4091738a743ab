package store

import (
	"context"
	"fmt"
	"strconv"

	"github.com/kvroute/kvroute"
	"github.com/redis/go-redis/v9"
)

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
	args := []any{strconv.FormatInt(ms(s.now()), 10), keyBytes(keys)}
	fields := make([]string, 0, 3*n)
	for _, r := range replicas {
		fields = append(fields, r, r+"#s", r+"#i")
	}
	lk := []string{blkKey(model), axKey(model)}
	var res *redis.Cmd
	var lres *redis.SliceCmd
	run := func(sha bool) error {
		_, err := s.c.Pipelined(ctx, func(p redis.Pipeliner) error {
			if sha {
				res = scriptLookup.EvalSha(ctx, p, lk, args...)
			} else {
				res = scriptLookup.Eval(ctx, p, lk, args...)
			}
			lres = p.HMGet(ctx, loadKey(model), fields...)
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
