// Package scoring decides which replica serves a request. It is pure: no I/O,
// no clock, and no randomness it is not handed. The service and the offline
// simulator reach it through router.Decide, the one decision core, so there
// is exactly one cost function in kvroute and what the simulator shows is
// what production does.
//
// The kv cost is written once in Go (kvCost, settle.go). When several pods
// decide together the store settles their bookings by that same cost:
// Settleable says which configurations it can settle, Settle builds what it
// is handed, and Settled is the settlement in Go that the booking script's
// one cost function mirrors (store/lua/reservebest.lua; held equal by
// store's TestReserveBestSettlesAsScoring).
package scoring

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
)

// Policy names a way of choosing among candidates.
type Policy string

const (
	// PolicyKV is NVIDIA Dynamo's blended cost: uncached prefill after an
	// overlap credit, plus the decode work a replica already owes.
	PolicyKV Policy = "kv"
	// PolicyHardSwitch is SGLang's gateway rule: shortest queue while the
	// fleet is imbalanced, longest prefix match otherwise.
	PolicyHardSwitch Policy = "hard-switch"
	// PolicyPureAffinity maximizes overlap and ignores load. It exists to
	// show herding; never run it in production.
	PolicyPureAffinity Policy = "pure-affinity"
	// PolicySession pins a session to a replica by consistent hashing.
	PolicySession Policy = "session"
	// PolicyLeastLoad is the kv cost with no overlap credit (Dynamo's
	// --load-aware preset): load balancing that ignores caches.
	PolicyLeastLoad Policy = "least-load"
	// PolicyRoundRobin cycles through routable replicas.
	PolicyRoundRobin Policy = "round-robin"
	// PolicyPowerOfTwo samples two replicas and takes the less loaded.
	PolicyPowerOfTwo Policy = "power-of-two"
)

// Policies lists every policy, in the order tables and help text show them.
var Policies = []Policy{PolicyKV, PolicyHardSwitch, PolicyPureAffinity, PolicySession, PolicyLeastLoad, PolicyRoundRobin, PolicyPowerOfTwo}

// ParsePolicy validates a policy name.
func ParsePolicy(s string) (Policy, error) {
	for _, p := range Policies {
		if string(p) == s {
			return p, nil
		}
	}
	names := make([]string, len(Policies))
	for i, p := range Policies {
		names[i] = string(p)
	}
	return "", fmt.Errorf("unknown policy %q (want one of %s)", s, strings.Join(names, ", "))
}

// Config holds the policy and its weights. The zero value is not useful;
// start from DefaultConfig (kvroute's measured defaults) or DynamoConfig
// (Dynamo's documented defaults, which the seed's experiments use).
type Config struct {
	Policy Policy `json:"policy"`
	// OverlapCredit is how many blocks of prefill one matched block saves.
	// 0 deletes cache awareness.
	OverlapCredit float64 `json:"overlap_credit"`
	// CreditDecay shrinks the credit of replicas carrying more prefill than
	// the least-loaded candidate: credit/(1+decay*excess/request blocks), so
	// 1 halves it at one request-equivalent of excess. It stops cache-rich
	// replicas from winning forever after an autoscale.
	CreditDecay float64 `json:"credit_decay"`
	// PrefillLoadScale weights the prefill term against the decode term.
	PrefillLoadScale float64 `json:"prefill_load_scale"`
	// DecodeRequestWeight charges each active request this many blocks, for
	// fleets where many small requests concentrate.
	DecodeRequestWeight float64 `json:"decode_request_weight"`
	// HostWeight credits a block held only in an offload tier at this
	// fraction of a GPU block: it must be copied back first.
	HostWeight float64 `json:"host_weight"`
	// ApproxWeight credits a block known only from the router's own past
	// decisions (replicas without events) at this fraction.
	ApproxWeight float64 `json:"approx_weight"`
	// PredictWeight credits a predicted block (one a booking sent to the
	// replica, whose prefill is still in flight) at this fraction of a
	// held block when the prefill starts, rising to the full credit as it
	// completes. 0 turns predictions off.
	PredictWeight float64 `json:"predict_weight"`

	// BalanceAbs and BalanceRel are hard-switch's imbalance test on active
	// requests: imbalanced when max-min > BalanceAbs AND max > BalanceRel*min.
	// The AND keeps a small, lightly loaded fleet from flapping on ratios.
	BalanceAbs float64 `json:"balance_abs"`
	BalanceRel float64 `json:"balance_rel"`
	// CacheThreshold is hard-switch's minimum match rate (matched/prompt
	// blocks) for routing on the prefix rather than on load.
	CacheThreshold float64 `json:"cache_threshold"`

	// VirtualNodes is how many points each replica has on the session ring.
	VirtualNodes int `json:"virtual_nodes"`
}

// DefaultConfig returns kvroute's kv defaults: overlap credit 4 and prefill
// load scale 2, otherwise Dynamo's (decay 0, request weight 0, host weight
// 0.75), and SGLang's gateway defaults for hard-switch (abs 64, rel 1.5,
// cache threshold 0.3).
//
// Dynamo's credit of 1 counts only what a matched block saves this request.
// Under cache pressure a miss costs more: the copy the other replica
// prefills evicts a block some later request would have hit there, and the
// extra prefill delays every request queued behind it. On the Mooncake
// trace at 4, 8 and 16 replicas (8 seeds each) credit 4 with scale 2 keeps
// pure affinity's hit rate (>= 0.95x of it, against 0.76-0.98x for credit
// 1) with TTFT p99 within 1.10x of the best, and does not herd: the seed's
// herding batch still spreads (no replica above 27% of requests, 3.7x pure
// affinity's makespan). Credit 8 starts to herd agentic sessions (TTFT p99
// 2.1x the best). BENCHMARKS.md and DESIGN.md have the measurements.
//
// Predicted entries count at 0.75 of a held block when their prefill
// starts: with the floor under the adjusted prefill (kvCost) it keeps kv
// within 1.05x of the best policy's TTFT and 0.95x of its hit rate on the
// herding and agentic workloads at 4, 8 and 16 replicas, where 0.5 moved
// conversations off their replica at 16 (hit 0.93x) (DESIGN.md,
// "Predicted entries").
func DefaultConfig() Config {
	c := DynamoConfig()
	c.OverlapCredit = 4
	c.PrefillLoadScale = 2
	c.PredictWeight = 0.75
	return c
}

// DynamoConfig returns Dynamo's documented kv defaults (credit 1, decay 0,
// prefill scale 1, request weight 0, host weight 0.75), the weights the
// seed's section 3 results were obtained with, and the same hard-switch and
// session settings as DefaultConfig.
func DynamoConfig() Config {
	return Config{
		Policy:              PolicyKV,
		OverlapCredit:       1,
		CreditDecay:         0,
		PrefillLoadScale:    1,
		DecodeRequestWeight: 0,
		HostWeight:          0.75,
		ApproxWeight:        1,
		BalanceAbs:          64,
		BalanceRel:          1.5,
		CacheThreshold:      0.3,
		VirtualNodes:        100,
	}
}

// Validate rejects weights that would make costs meaningless.
func (c Config) Validate() error {
	if _, err := ParsePolicy(string(c.Policy)); err != nil {
		return err
	}
	for _, w := range []struct {
		name string
		v    float64
	}{
		{"overlap_credit", c.OverlapCredit}, {"credit_decay", c.CreditDecay},
		{"prefill_load_scale", c.PrefillLoadScale}, {"decode_request_weight", c.DecodeRequestWeight},
		{"host_weight", c.HostWeight}, {"approx_weight", c.ApproxWeight}, {"predict_weight", c.PredictWeight},
		{"balance_abs", c.BalanceAbs}, {"balance_rel", c.BalanceRel}, {"cache_threshold", c.CacheThreshold},
	} {
		if w.v < 0 || math.IsNaN(w.v) || math.IsInf(w.v, 0) {
			return fmt.Errorf("%s must be a finite number >= 0, got %v", w.name, w.v)
		}
	}
	if c.HostWeight > 1 || c.ApproxWeight > 1 || c.PredictWeight > 1 {
		return errors.New("host_weight, approx_weight and predict_weight must be <= 1")
	}
	if c.VirtualNodes < 1 || c.VirtualNodes > 10_000 {
		return fmt.Errorf("virtual_nodes must be in 1..10000, got %d", c.VirtualNodes)
	}
	return nil
}

// Load is a replica's outstanding work in blocks. It is float because the
// simulator books fractional expectations; the store's integers convert
// exactly.
type Load struct {
	Prefill  float64 `json:"prefill_blocks"`
	Decode   float64 `json:"decode_blocks"`
	Requests float64 `json:"requests"`
}

func (l Load) blocks() float64 { return l.Prefill + l.Decode }

// Candidate is one replica as the caller sees it for this request.
type Candidate struct {
	ID       string
	Routable bool
	// GPU, Any and Approx are leading blocks of the request held on GPU, in
	// any tier, and recorded from past decisions (see kvroute.Overlap).
	GPU, Any, Approx int
	// Predicted is leading blocks a live prediction says the replica will
	// hold once the prefill booked on it has run, Ready how far (0..1)
	// that prefill is, and Wait the prefill blocks still to run before
	// they are held (kvroute.PredictedOverlap).
	Predicted int
	Ready     float64
	Wait      float64
	Load      Load
}

// Request is what scoring needs to know about the incoming request.
type Request struct {
	// Blocks is the number of full prompt blocks.
	Blocks int
	// ActiveBlocks is the decode work the request adds wherever it goes
	// (prompt plus expected output blocks). It shifts every cost equally,
	// so it never changes the pick; it is reported in explanations.
	ActiveBlocks float64
	// SessionID keys the session policy; empty falls back to least-load.
	SessionID string
	// Counter drives round-robin; callers keep it.
	Counter uint64
}

// Rand is the randomness scoring may use: tie-breaks and power-of-two
// sampling. *math/rand/v2.Rand satisfies it; tests pass a seeded one.
type Rand interface {
	// IntN returns a uniform integer in [0, n).
	IntN(n int) int
}

// Score is one candidate's cost and its parts, for explain.
type Score struct {
	ID       string `json:"id"`
	Eligible bool   `json:"eligible"`
	// Matched is the credited overlap in GPU-block units: GPU blocks, plus
	// host-only blocks at HostWeight, or approximate blocks at ApproxWeight
	// when those promise more.
	Matched float64 `json:"matched"`
	GPU     int     `json:"gpu_blocks"`
	Any     int     `json:"any_blocks"`
	Approx  int     `json:"approx_blocks"`
	// Predicted is the leading blocks held or predicted (see Candidate),
	// Held the held ones in GPU-block units, before any prediction.
	Predicted int     `json:"predicted_blocks,omitempty"`
	Held      float64 `json:"held"`
	Credit    float64 `json:"credit"`
	// Credited is the prefill blocks the overlap is worth in the cost
	// (Credit times the held blocks, plus the predicted ones at their
	// weight), and Owed the prefill a booking there owes.
	Credited float64 `json:"credited"`
	Owed     int64   `json:"owed_blocks"`
	// Floor is the least the adjusted prefill can be: Owed, plus the wait
	// for an in-flight prefill beyond the predicted blocks it computes
	// (at 1/PrefillLoadScale).
	Floor      float64 `json:"floor"`
	RawPrefill float64 `json:"raw_prefill"`
	Prefill    float64 `json:"adjusted_prefill"`
	Decode     float64 `json:"decode"`
	Requests   float64 `json:"request_blocks"`
	Cost       float64 `json:"cost"`
}

// Result is a decision: the chosen candidate and every candidate's score.
type Result struct {
	// Pick indexes the candidates slice given to Pick.
	Pick   int     `json:"-"`
	Policy Policy  `json:"policy"`
	Mode   string  `json:"mode,omitempty"`
	Scores []Score `json:"candidates"`
}

// ErrNoCandidate means no candidate was routable.
var ErrNoCandidate = errors.New("scoring: no routable candidate")

// Pick chooses a candidate under cfg.Policy. It never picks an unroutable
// candidate; ties go to the lowest load, then to rng.
func Pick(cfg Config, req Request, cands []Candidate, rng Rand) (Result, error) {
	res := Result{Pick: -1, Policy: cfg.Policy, Scores: make([]Score, len(cands))}
	if cfg.Policy != PolicyKV && cfg.Policy != "" {
		// Predictions are the kv cost's: the other policies are
		// references, measured as they were built.
		cfg.PredictWeight = 0
	}
	eligible := make([]int, 0, len(cands))
	for i, c := range cands {
		if c.Routable {
			eligible = append(eligible, i)
		}
	}
	costs(cfg, req, cands, res.Scores)
	if len(eligible) == 0 {
		return res, ErrNoCandidate
	}
	switch cfg.Policy {
	case PolicyKV, "":
		res.Policy = PolicyKV
		res.Pick = argmin(eligible, cands, rng, func(i int) float64 { return res.Scores[i].Cost })
	case PolicyLeastLoad:
		res.Pick = leastLoaded(cfg, req, eligible, cands, rng)
	case PolicyPureAffinity:
		res.Pick = argmin(eligible, cands, rng, func(i int) float64 { return -res.Scores[i].Matched })
	case PolicyHardSwitch:
		res.Pick, res.Mode = hardSwitch(cfg, req, eligible, cands, res.Scores, rng)
	case PolicySession:
		if req.SessionID == "" {
			res.Mode = "no-session"
			res.Pick = leastLoaded(cfg, req, eligible, cands, rng)
			break
		}
		res.Pick = ringPick(cfg.VirtualNodes, req.SessionID, eligible, cands)
	case PolicyRoundRobin:
		res.Pick = eligible[req.Counter%uint64(len(eligible))]
	case PolicyPowerOfTwo:
		res.Pick = powerOfTwo(eligible, cands, rng)
	default:
		return res, fmt.Errorf("scoring: unknown policy %q", cfg.Policy)
	}
	return res, nil
}

// Keeps reports whether cands[pick] wins under cfg on load alone, with no
// tie to break: its cost is strictly below every other eligible
// candidate's. It answers only for the cost policies (kv, least-load); for
// the others, where load is not the whole reason for a pick, it is false.
// The router uses it to learn how much a contested pick's load may grow
// before a booking on it would no longer be the same decision.
func Keeps(cfg Config, req Request, cands []Candidate, pick int) bool {
	if pick < 0 || pick >= len(cands) || !cands[pick].Routable {
		return false
	}
	switch cfg.Policy {
	case PolicyKV, "":
	case PolicyLeastLoad:
		cfg.OverlapCredit, cfg.PredictWeight = 0, 0
	default:
		return false
	}
	return below(cfg, req, cands, pick, func(other, mine float64) bool { return other <= mine+1e-9 })
}

// Cheapest reports whether cands[pick] is among the cheapest eligible
// candidates under the kv cost of cfg (within a tie).
func Cheapest(cfg Config, req Request, cands []Candidate, pick int) bool {
	if pick < 0 || pick >= len(cands) || !cands[pick].Routable {
		return false
	}
	return below(cfg, req, cands, pick, func(other, mine float64) bool { return other < mine-1e-9 })
}

// below reports whether no other eligible candidate's cost beats pick's
// by beats. Keeps and Cheapest ask it a few times per decision (the
// router's Slack searches), so the scores are scratch space, reused.
func below(cfg Config, req Request, cands []Candidate, pick int, beats func(other, mine float64) bool) bool {
	sp := keepScores.Get().(*[]Score)
	defer keepScores.Put(sp)
	s := slices.Grow((*sp)[:0], len(cands))[:len(cands)]
	*sp = s
	costs(cfg, req, cands, s)
	for i, c := range cands {
		if i != pick && c.Routable && beats(s[i].Cost, s[pick].Cost) {
			return false
		}
	}
	return true
}

var keepScores = sync.Pool{New: func() any { return new([]Score) }}

// costs fills every candidate's kv cost (kvCost), eligible or not, so that
// explain shows why an unroutable replica would or would not have won.
func costs(cfg Config, req Request, cands []Candidate, out []Score) {
	minPrefill := math.Inf(1)
	for _, c := range cands {
		if c.Routable && c.Load.Prefill < minPrefill {
			minPrefill = c.Load.Prefill
		}
	}
	if math.IsInf(minPrefill, 1) {
		minPrefill = 0
	}
	reqBlocks := float64(req.Blocks)
	for i, c := range cands {
		credit := cfg.OverlapCredit
		if cfg.CreditDecay > 0 {
			excess := math.Max(0, c.Load.Prefill-minPrefill) / math.Max(reqBlocks, 1)
			credit /= 1 + cfg.CreditDecay*excess
		}
		held, matched, credited, excess := creditedBlocks(cfg, c, credit)
		owed := PrefillOwed(req.Blocks, matched)
		floor := float64(owed)
		if excess > 0 && cfg.PrefillLoadScale > 0 {
			// A wait is charged once, as decode is, not at the prefill
			// scale: the prefill scale weighs work the replica must do,
			// which delays every request behind it, and a wait for a
			// prefill already booked adds none.
			floor += excess / cfg.PrefillLoadScale
		}
		t := kvCost(cfg.PrefillLoadScale, cfg.DecodeRequestWeight, c.Load, reqBlocks, req.ActiveBlocks, credited, floor)
		out[i] = Score{
			ID: c.ID, Eligible: c.Routable, Matched: matched,
			GPU: c.GPU, Any: c.Any, Approx: c.Approx, Predicted: c.Predicted,
			Credit: credit, Credited: credited, Owed: owed, Floor: floor, Held: held,
			RawPrefill: t.raw, Prefill: t.adjusted, Decode: t.decode, Requests: t.reqs, Cost: t.cost,
		}
	}
}

// creditedBlocks is a candidate's overlap as the kv cost counts it:
// matched, the leading blocks a booking there treats as cached (its
// prefill owed is the rest), and credited, the prefill blocks they are
// worth in its cost.
//
// Held blocks are in GPU-block units: GPU blocks, plus host-only blocks at
// HostWeight, or approximate blocks at ApproxWeight when those promise
// more (event-fed and approximate overlap are alternatives, not
// additions: the approximate record only stands in where events say
// less). Each is worth credit blocks.
//
// Predicted blocks beyond those are the prefill in flight on the replica:
// a request sent there shares it, so it owes none of it, but waits for it
// (the wait is in the replica's booked prefill load), and until it is done
// the blocks are not yet a cache whose loss elsewhere would cost later
// requests: each is worth credit × (PredictWeight + (1−PredictWeight) ×
// Ready), from PredictWeight of a held block when the prefill starts to a
// whole one when it is due.
func creditedBlocks(cfg Config, c Candidate, credit float64) (held, matched, credited, excess float64) {
	any := max(c.Any, c.GPU)
	events := float64(c.GPU) + cfg.HostWeight*float64(any-c.GPU)
	held = math.Max(events, cfg.ApproxWeight*float64(c.Approx))
	if cfg.PredictWeight == 0 || float64(c.Predicted) <= held {
		return held, held, float64(credit * held), 0
	}
	w := cfg.PredictWeight + float64((1-cfg.PredictWeight)*min(max(c.Ready, 0), 1))
	extra := float64(c.Predicted) - held
	return held, float64(c.Predicted), float64(credit * float64(held+float64(w*extra))), max(0, c.Wait-extra)
}

// leastLoaded is the kv cost with no overlap credit.
func leastLoaded(cfg Config, req Request, eligible []int, cands []Candidate, rng Rand) int {
	cfg.OverlapCredit = 0
	s := make([]Score, len(cands))
	costs(cfg, req, cands, s)
	return argmin(eligible, cands, rng, func(i int) float64 { return s[i].Cost })
}

// hardSwitch applies SGLang's two-condition imbalance test on active
// requests, then routes on load or on the prefix.
func hardSwitch(cfg Config, req Request, eligible []int, cands []Candidate, s []Score, rng Rand) (int, string) {
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, i := range eligible {
		lo = math.Min(lo, cands[i].Load.Requests)
		hi = math.Max(hi, cands[i].Load.Requests)
	}
	queue := func(i int) float64 { return cands[i].Load.Requests }
	if hi-lo > cfg.BalanceAbs && hi > cfg.BalanceRel*lo {
		return argmin(eligible, cands, rng, queue), "imbalanced"
	}
	best := argmin(eligible, cands, rng, func(i int) float64 { return -s[i].Matched })
	if req.Blocks > 0 && s[best].Matched/float64(req.Blocks) >= cfg.CacheThreshold {
		return best, "prefix"
	}
	return argmin(eligible, cands, rng, queue), "low-match"
}

func powerOfTwo(eligible []int, cands []Candidate, rng Rand) int {
	if len(eligible) == 1 {
		return eligible[0]
	}
	a := rng.IntN(len(eligible))
	b := rng.IntN(len(eligible) - 1)
	if b >= a {
		b++
	}
	i, j := eligible[a], eligible[b]
	if cands[j].Load.blocks() < cands[i].Load.blocks() {
		return j
	}
	return i
}

// argmin returns the eligible index with the lowest value. Ties go to the
// lowest load, then to a uniform draw from rng: a fixed tie-break (always
// the first replica) is exactly how an empty index herds.
func argmin(eligible []int, cands []Candidate, rng Rand, value func(int) float64) int {
	const eps = 1e-9
	var best []int
	var bestV, bestL float64
	for _, i := range eligible {
		v, l := value(i), cands[i].Load.blocks()
		switch {
		case best == nil || v < bestV-eps || (math.Abs(v-bestV) <= eps && l < bestL-eps):
			best = append(best[:0], i)
			bestV, bestL = v, l
		case math.Abs(v-bestV) <= eps && math.Abs(l-bestL) <= eps:
			best = append(best, i)
		}
	}
	if len(best) == 1 || rng == nil {
		return best[0]
	}
	return best[rng.IntN(len(best))]
}
