package store

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/redis/go-redis/v9"
)

// Lookup returns, for each candidate replica in order, how many leading
// blocks of keys it holds (on GPU, in any tier, approximately) and its load,
// in one round trip. Redis work grows with log2(len(keys)) times the number
// of distinct answers, not with len(keys) nor with the number of candidates
// that share an answer: see lua/lookup.lua.
func (s *Store) Lookup(ctx context.Context, model string, keys []kvroute.BlockKey, replicas []string) ([]kvroute.Overlap, []kvroute.Load, error) {
	if len(replicas) == 0 {
		return nil, nil, nil
	}
	ov, loads, stale, err := s.lookup(ctx, model, keys, replicas, true)
	if stale {
		// A slot changed since this pod cached them: read them too.
		ov, loads, _, err = s.lookup(ctx, model, keys, replicas, false)
	}
	return ov, loads, err
}

// lookup is Lookup, with cached slots when useCache is set and the cache
// has them; stale reports that '#g' moved since they were cached (the
// answer is then not given: look up again without the cache).
func (s *Store) lookup(ctx context.Context, model string, keys []kvroute.BlockKey, replicas []string, useCache bool) (ov []kvroute.Overlap, loads []kvroute.Load, stale bool, err error) {
	n := len(replicas)
	now := s.now()
	var slots []any
	var gen any
	cached := false
	if useCache {
		slots, gen, cached = s.slotc.get(model, replicas, now)
	}
	// The search runs as a script; the candidates' loads (and slots, when
	// not cached) are one plain HMGET in the same pipeline (one round
	// trip): Redis converts a long reply into Lua values far slower than
	// it sends it to a client.
	fields := loadFields(replicas, cached)
	var hints []int32
	known := false
	if !s.noHints {
		hints, known = s.hints.get(model, keys)
	}
	var segs, asegs []any
	var lv []any
	plain := false
	// A chain of at most hintStride blocks is read whole (every block a
	// probe, which proves every run: it always is, so it is no evidence
	// for fast's verdict on the hinted reads); a longer one needs its
	// hints, which may be none: one run from the first block to the last,
	// proved by those two.
	short := len(keys) > 0 && len(keys) <= hintStride
	if short || (known && s.fast.try()) {
		var ok bool
		segs, asegs, lv, ok, err = s.lookupPlain(ctx, model, keys, hints, fields)
		if err != nil {
			return nil, nil, false, err
		}
		if !short {
			s.fast.result(ok)
		}
		plain = ok
	}
	if !plain {
		if segs, asegs, lv, err = s.lookupScript(ctx, model, keys, hints, fields); err != nil {
			return nil, nil, false, err
		}
		if !s.noHints {
			s.hints.put(model, keys, segs, asegs)
		}
	}
	if len(lv) != len(fields) {
		return nil, nil, false, fmt.Errorf("store: lookup: short reply (%d load fields for %d replicas)", len(lv), n)
	}
	g := lv[len(lv)-1]
	switch {
	case cached && g != gen:
		return nil, nil, true, nil
	case !cached:
		slots = lv[3*n : 4*n]
		s.slotc.put(model, replicas, slots, g, now)
	}
	ov, loads, err = decodeLookup(segs, asegs, lv[:2*n], slots, replicas)
	if err == nil {
		predictedOverlaps(ov, lv[2*n:3*n], keys, now)
	}
	return ov, loads, false, err
}

// predictedOverlaps fills each candidate's predicted overlap from its
// "<replica>#p" field as read (kvroute.PredictedOverlap at now).
func predictedOverlaps(ov []kvroute.Overlap, fields []any, keys []kvroute.BlockKey, now time.Time) {
	for i, f := range fields {
		if str, ok := f.(string); ok && str != "" {
			ov[i].Predicted, ov[i].Ready, ov[i].Wait = kvroute.PredictedOverlap(decodePredictions(str), keys, now)
		}
	}
}

// loadFields are the load hash fields a lookup reads: every replica's
// booked and scraped load, then every replica's predicted entries
// (predict.go), then (unless the slots are cached) every replica's slot,
// then '#g', which says whether cached slots still hold.
func loadFields(replicas []string, cachedSlots bool) []string {
	fields := loadPairs(replicas, 2*len(replicas)+1)
	for _, r := range replicas {
		fields = append(fields, r+"#p")
	}
	if !cachedSlots {
		for _, r := range replicas {
			fields = append(fields, r+"#i")
		}
	}
	return append(fields, "#g")
}

// lookupScript runs lookup.lua, pipelined with the load fields' HMGET.
func (s *Store) lookupScript(ctx context.Context, model string, keys []kvroute.BlockKey, hints []int32, fields []string) (segs, asegs, lv []any, err error) {
	args := []any{strconv.FormatInt(ms(s.now()), 10), keyBytes(keys)}
	for _, h := range hints {
		args = append(args, strconv.Itoa(int(h)))
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
	err = run(true)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		err = run(false)
	}
	if err != nil {
		return nil, nil, nil, wrap("lookup", err)
	}
	v, err := res.Slice()
	if err != nil {
		return nil, nil, nil, wrap("lookup", err)
	}
	if lv, err = lres.Result(); err != nil {
		return nil, nil, nil, wrap("lookup", err)
	}
	if len(v) != 2 {
		return nil, nil, nil, fmt.Errorf("store: lookup: unexpected reply of %d values", len(v))
	}
	segs, _ = v[0].([]any)
	asegs, _ = v[1].([]any)
	return segs, asegs, lv, nil
}

// decodeLookup turns a lookup's segments, the candidates' load fields (two
// per replica) and their slots into its answer.
func decodeLookup(segs, asegs []any, lv, slots []any, replicas []string) ([]kvroute.Overlap, []kvroute.Load, error) {
	loads, err := parseLoads("lookup", lv, replicas)
	if err != nil {
		return nil, nil, err
	}
	ov := make([]kvroute.Overlap, len(replicas))
	for i := range ov {
		str, ok := slots[i].(string)
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

// Lookup hints. A binary search proves a run of equal holder sets with two
// probes (its first and last block) but must find where runs end; chains
// come back (a conversation's next turn, an agent's next step, another
// request on the same document) and their run ends mostly stay where they
// were. So each Store remembers, per chain prefix, the run ends its last
// lookup found, and lookup.lua probes them (and the block after each) in its
// first HMGET: when they still hold, every run is proved in that one call
// instead of ~log2(blocks) levels. Hints only add probes, so they can be
// stale, wrong or another pod's business without changing an answer.
const (
	// hintStride: a lookup's hints are filed under the key of every
	// hintStride-th block of its chain, and a request takes those of its
	// deepest such block found, so a chain that shares a prefix of at
	// least hintStride blocks with an earlier one reuses its run ends.
	hintStride = 16
	// hintMax bounds the positions sent with one lookup.
	hintMax = 128
	// hintEntries bounds each of the cache's two generations.
	hintEntries = 1 << 14
)

type hintKey struct {
	model string
	key   kvroute.BlockKey
}

// hintCache maps a chain prefix (its last block's key: keys are chained, so
// one names the whole prefix) to the run ends last found below it. When
// the current generation is full it becomes the old one and the older is
// dropped, so memory stays bounded and recently used entries survive.
type hintCache struct {
	mu       sync.Mutex
	cur, old map[hintKey][]int32
}

// get returns the run ends filed for the deepest of keys' prefixes that
// has some; found is false when none has (a chain this pod has not looked
// up), and true with no ends for a chain found to be one run.
func (h *hintCache) get(model string, keys []kvroute.BlockKey) (ends []int32, found bool) {
	n := len(keys)
	if n <= hintStride {
		return nil, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for p := (n - 1) / hintStride * hintStride; p >= hintStride; p -= hintStride {
		k := hintKey{model, keys[p]}
		if v, ok := h.cur[k]; ok {
			return v, true
		}
		if v, ok := h.old[k]; ok {
			h.set(k, v)
			return v, true
		}
	}
	return nil, false
}

// put files the run ends of segs (lookup.lua's GPU segments: run ends and
// their values) for keys: each end and the block after it, where the next
// run starts.
func (h *hintCache) put(model string, keys []kvroute.BlockKey, segs, asegs []any) {
	n := len(keys)
	if n <= hintStride {
		return
	}
	// The approximate entries' run ends too: the plain read proves both
	// at the same probes, and a fleet without events has only those.
	var pos []int32
	for _, sg := range [][]any{segs, asegs} {
		for j := 0; j+1 < len(sg) && len(pos)+2 <= hintMax; j += 2 {
			if e := asInt(sg[j]); e < n-1 {
				pos = append(pos, int32(e), int32(e+1))
			}
		}
	}
	slices.Sort(pos)
	pos = slices.Compact(pos)
	h.mu.Lock()
	defer h.mu.Unlock()
	for p := hintStride; p < n; p += hintStride {
		h.set(hintKey{model, keys[p]}, pos)
	}
}

func (h *hintCache) set(k hintKey, v []int32) {
	if h.cur == nil || len(h.cur) >= hintEntries {
		h.old, h.cur = h.cur, make(map[hintKey][]int32, hintEntries/4)
	}
	h.cur[k] = v
}
