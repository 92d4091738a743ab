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

// Apply is one cache event reaching the index: replica p stored (or
// removed) keys in tier t.
func (v *RouterView) Apply(store bool, p int, t kvroute.Tier, keys []kvroute.BlockKey) {
	ix := v.index
	if t != kvroute.TierGPU {
		ix = v.host
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
		v.cands[j] = router.Candidate{
			ID: v.ids[j], Routable: a.Eligible == nil || a.Eligible[j], Events: v.events[j],
			Overlap: kvroute.Overlap{GPU: v.gpu[j], Any: v.any[j], Approx: v.apx[j]},
			Load:    v.load[j],
		}
	}
	out, err := router.Decide(v.cfg, router.Input{
		Blocks: len(a.Keys), PromptTokens: a.PromptTokens, BlockSize: a.BlockSize,
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
	if out.RecordApprox {
		bit := uint64(1) << uint(p)
		for _, k := range a.Keys {
			v.approx[k] |= bit
		}
	}
	return out, nil
}

// BestMatch is the most leading keys any replica holds in the index (GPU
// tier), as a decision would see them now.
func (v *RouterView) BestMatch(keys []kvroute.BlockKey) int {
	v.matched(v.index, nil, keys, v.gpu)
	return slices.Max(v.gpu)
}

// FirstToken ends the prefill part of a booking on replica p.
func (v *RouterView) FirstToken(p int, l kvroute.Lease) {
	v.load[p].Prefill -= float64(l.PrefillBlocks)
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
