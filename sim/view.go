package sim

import (
	"fmt"
	"math/bits"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// RouterView is the simulator's model of the service's router: the index
// that cache events build (GPU and host tiers), the approximate entries its
// own dispatches leave for replicas that publish no events, and the loads
// its bookings add. Every decision goes through router.Decide, the
// function the service's Router calls, so what the simulator shows is what
// production decides, bookings included; a test in tests/ holds the two
// to the same answers over a real store.
//
// The engine model only ever produces GPU-tier events; the host tier is
// here so that the view can hold everything the service's index holds.
type RouterView struct {
	cfg    router.Config
	events []bool
	index  map[kvroute.BlockKey]uint64 // GPU tier, a bit per replica
	host   map[kvroute.BlockKey]uint64 // offload tiers
	approx map[kvroute.BlockKey]uint64
	load   []scoring.Load
	ids    []string
	cands  []router.Candidate
	gpu    []int
	any    []int
	apx    []int
	rng    *rand.Rand
	count  uint64
	// pred holds each replica's predicted entries, as the store holds
	// them beside its load (store/lua/predict.lua), and counts what
	// became of them.
	pred   [][]kvroute.Prediction
	counts PredictionCounts
}

// PredictionCounts is what became of the predicted entries decisions
// wrote: confirmed by the event that stored the chain's end, ended by an
// eviction of one of their blocks, or expired unconfirmed (a prediction
// that never came true is a phantom of its own), and the decisions whose
// pick they changed.
type PredictionCounts struct {
	Written   int `json:"written"`
	Confirmed int `json:"confirmed"`
	Evicted   int `json:"evicted"`
	Expired   int `json:"expired"`
	// Decisions counted a prediction in some candidate's cost; Changed
	// would have picked otherwise without predictions.
	Decisions int `json:"decisions"`
	Changed   int `json:"changed"`
}

// NewRouterView is a view of n replicas (1..64) named r0..r<n-1>, deciding
// under cfg with tie-breaks drawn from rng. events says whether replicas
// publish KV events; without them every decision records approximate
// entries, as the service does for such replicas.
func NewRouterView(n int, cfg router.Config, events bool, rng *rand.Rand) (*RouterView, error) {
	if n < 1 || n > 64 {
		return nil, fmt.Errorf("sim: router view: replicas must be in 1..64, got %d", n)
	}
	v := &RouterView{
		cfg: cfg, events: make([]bool, n), rng: rng,
		index:  make(map[kvroute.BlockKey]uint64),
		host:   make(map[kvroute.BlockKey]uint64),
		approx: make(map[kvroute.BlockKey]uint64),
		load:   make([]scoring.Load, n),
		ids:    make([]string, n),
		cands:  make([]router.Candidate, n),
		gpu:    make([]int, n),
		any:    make([]int, n),
		apx:    make([]int, n),
		pred:   make([][]kvroute.Prediction, n),
	}
	for i := range v.ids {
		v.ids[i] = "r" + strconv.Itoa(i)
		v.events[i] = events
	}
	return v, nil
}

// SetEvents says whether replica p publishes KV events.
func (v *RouterView) SetEvents(p int, on bool) { v.events[p] = on }

// IDs are the replicas' ids, in order.
func (v *RouterView) IDs() []string { return v.ids }

// Load is what the view has booked on replica p.
func (v *RouterView) Load(p int) scoring.Load { return v.load[p] }

// Apply is one cache event reaching the index at now: replica p stored
// (or removed) keys in tier t.
func (v *RouterView) Apply(store bool, p int, t kvroute.Tier, keys []kvroute.BlockKey, now time.Time) {
	ix := v.index
	if t != kvroute.TierGPU {
		ix = v.host
	}
	if t == kvroute.TierGPU {
		// As apply.lua: GPU stores confirm, GPU removals end.
		v.endPredictions(store, p, keys, now)
	}
	bit := uint64(1) << uint(p)
	for _, k := range keys {
		if store {
			ix[k] |= bit
		} else if m, ok := ix[k]; ok {
			if m &^= bit; m == 0 {
				delete(ix, k)
			} else {
				ix[k] = m
			}
		}
	}
}

// Ask is one request as the view decides it.
type Ask struct {
	Keys         []kvroute.BlockKey
	PromptTokens int
	BlockSize    int
	// MaxTokens 0 takes the view's router.Config.MaxTokens.
	MaxTokens int
	SessionID string
	Now       time.Time
	// Eligible, when not nil, marks the replicas the request may go to
	// (admission's replicas with room); the others are not routable.
	Eligible []bool
}

// Decide routes one request and books its lease on the pick, as the
// service's Router does (minus the store round trips).
func (v *RouterView) Decide(a Ask) (router.Outcome, error) {
	v.matched(v.index, nil, a.Keys, v.gpu)
	if len(v.host) == 0 {
		copy(v.any, v.gpu)
	} else {
		v.matched(v.index, v.host, a.Keys, v.any)
	}
	if len(v.approx) == 0 {
		clear(v.apx)
	} else {
		v.matched(v.approx, nil, a.Keys, v.apx)
	}
	for j := range v.cands {
		o := kvroute.Overlap{GPU: v.gpu[j], Any: v.any[j], Approx: v.apx[j]}
		o.Predicted, o.Ready, o.Wait = kvroute.PredictedOverlap(v.pred[j], a.Keys, a.Now)
		v.cands[j] = router.Candidate{
			ID: v.ids[j], Routable: a.Eligible == nil || a.Eligible[j], Events: v.events[j],
			Overlap: o,
			Load:    v.load[j],
		}
	}
	out, err := router.Decide(v.cfg, router.Input{
		RequestID: strconv.FormatUint(v.count, 10), Keys: a.Keys, Blocks: len(a.Keys), PromptTokens: a.PromptTokens, BlockSize: a.BlockSize,
		MaxTokens: a.MaxTokens, SessionID: a.SessionID, Counter: v.count, Now: a.Now,
		Candidates: v.cands,
	}, v.rng)
	v.count++
	if err != nil {
		return out, err
	}
	p := out.Pick
	v.load[p].Prefill += float64(out.Lease.PrefillBlocks)
	v.load[p].Decode += float64(out.Lease.DecodeBlocks)
	v.load[p].Requests++
	if out.Predicted {
		v.counts.Decisions++
		if out.PredictionChanged {
			v.counts.Changed++
		}
	}
	if plan := out.Lease.Predict; plan != nil {
		v.predict(p, out.Lease.RequestID, *plan, a.Now)
	}
	if out.RecordApprox {
		bit := uint64(1) << uint(p)
		for _, k := range a.Keys {
			v.approx[k] |= bit
		}
	}
	return out, nil
}

// predict records a booking's predicted entry on replica p, as
// store/lua/predict.lua does: expired entries are dropped (counted), the
// new one is due when p's booked prefill (its own included) has run, and
// when p holds MaxPredictions the one that expires first makes room.
func (v *RouterView) predict(p int, owner string, plan kvroute.PredictPlan, now time.Time) {
	kept := v.pred[p][:0]
	for _, e := range v.pred[p] {
		switch {
		case !now.Before(e.Expires):
			if !e.Confirmed {
				v.counts.Expired++
			}
		case e.Owner != owner:
			kept = append(kept, e)
		}
	}
	if len(kept) >= kvroute.MaxPredictions {
		first := 0
		for i, e := range kept {
			if e.Expires.Before(kept[first].Expires) {
				first = i
			}
		}
		if !kept[first].Confirmed {
			v.counts.Expired++
		}
		kept = slices.Delete(kept, first, first+1)
	}
	span := int64(v.load[p].Prefill)
	ready, expires := plan.Timing(now, span)
	v.pred[p] = append(kept, kvroute.Prediction{Owner: owner, Start: time.UnixMilli(now.UnixMilli()), Ready: ready, Expires: expires, Span: span, Marks: plan.Marks})
	v.counts.Written++
}

// endPredictions applies one event batch, applied at now, to replica p's
// predicted entries, as store/lua/predict.lua's predictEnd does: stored
// keys that include an entry's end confirm it (it stays, due now, until
// it expires); removed keys that include any of its marks end it (counted
// evicted unless it was confirmed).
func (v *RouterView) endPredictions(store bool, p int, keys []kvroute.BlockKey, now time.Time) {
	if len(v.pred[p]) == 0 {
		return
	}
	set := make(map[kvroute.BlockKey]struct{}, len(keys))
	for _, k := range keys {
		set[k] = struct{}{}
	}
	kept := v.pred[p][:0]
	for _, e := range v.pred[p] {
		switch {
		case store && has(set, e.Marks[len(e.Marks)-1].Key):
			if !e.Confirmed {
				v.counts.Confirmed++
				e.Confirmed = true
				e.DueAt(now)
			}
		case !store && slices.ContainsFunc(e.Marks, func(m kvroute.Mark) bool { return has(set, m.Key) }):
			if !e.Confirmed {
				v.counts.Evicted++
			}
			continue
		}
		kept = append(kept, e)
	}
	v.pred[p] = kept
}

func has(set map[kvroute.BlockKey]struct{}, k kvroute.BlockKey) bool {
	_, ok := set[k]
	return ok
}

// Predictions is what became of the predicted entries so far; entries
// still held that expired by now unconfirmed count as expired.
func (v *RouterView) Predictions(now time.Time) PredictionCounts {
	c := v.counts
	for _, es := range v.pred {
		for _, e := range es {
			if !now.Before(e.Expires) && !e.Confirmed {
				c.Expired++
			}
		}
	}
	return c
}

// BestMatch is the most leading keys any replica holds in the index (GPU
// tier), as a decision would see them now.
func (v *RouterView) BestMatch(keys []kvroute.BlockKey) int {
	v.matched(v.index, nil, keys, v.gpu)
	return slices.Max(v.gpu)
}

// FirstToken ends the prefill part of a booking on replica p at now: its
// predicted entry is due now, if it was not yet, and expires as much
// sooner (store/lua/predict.lua's predictAdvance).
func (v *RouterView) FirstToken(p int, l kvroute.Lease, now time.Time) {
	v.load[p].Prefill -= float64(l.PrefillBlocks)
	for i := range v.pred[p] {
		if e := &v.pred[p][i]; e.Owner == l.RequestID {
			e.DueAt(now)
		}
	}
}

// Release ends the rest of a booking on replica p.
func (v *RouterView) Release(p int, l kvroute.Lease) {
	v.load[p].Decode -= float64(l.DecodeBlocks)
	v.load[p].Requests--
	if v.load[p].Requests == 0 { // shed drift
		v.load[p] = scoring.Load{}
	}
}

// matched writes each replica's count of leading keys held in ix (or in
// ix or also, when not nil), in one descent over a replica bitmask.
func (v *RouterView) matched(ix, also map[kvroute.BlockKey]uint64, keys []kvroute.BlockKey, out []int) {
	clear(out)
	n := len(v.ids)
	alive := uint64(1)<<uint(n) - 1
	if n == 64 {
		alive = ^uint64(0)
	}
	for d, k := range keys {
		h := ix[k]
		if also != nil {
			h |= also[k]
		}
		h &= alive
		for gone := alive &^ h; gone != 0; gone &= gone - 1 {
			out[bits.TrailingZeros64(gone)] = d
		}
		alive = h
		if alive == 0 {
			return
		}
	}
	for ; alive != 0; alive &= alive - 1 {
		out[bits.TrailingZeros64(alive)] = len(keys)
	}
}
