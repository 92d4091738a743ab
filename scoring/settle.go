package scoring

import (
	"cmp"
	"math"
	"slices"

	"github.com/kvroute/kvroute"
)

// Settling a booking in the store. Decisions in flight together read the
// same loads and mostly pick the same replica; booked on the version they
// scored, all but the first lose, score again and retry. Under the kv cost
// the store can settle that itself: a decision hands it its pick and the
// next cheapest candidates (Settle), and the store books whichever is
// cheapest by the loads as they are when the booking runs (Settled, which
// store/lua/reservebest.lua's cost function mirrors operation by
// operation). Everything about that cost is here, in Go, once: the router
// builds what it hands over with Settle, the in-memory store settles with
// Settled, and only the Lua copy lives elsewhere, held equal to this file
// by store's TestReserveBestSettlesAsScoring.

// SettleChoices is how many candidates a booking leaves to the store: the
// pick and the next cheapest. A burst rarely moves a pick further than a
// few places, and the store costs each one it is given: with 8 the script
// took 34–41 µs of Redis a decision at one shard's ceiling, with 4 27–33,
// and the 3% of bookings it then refused (the cheapest had grown past
// the fifth) cost less than that.
const SettleChoices = 4

// SettleEps is the tie tolerance a settlement uses: Pick's own, so that
// the store breaks ties where the router would.
const SettleEps = 1e-9

// Settleable reports whether the store can settle bookings decided under
// cfg. It lists what it knows rather than what it does not: a field added
// to Config is refused (the router then books on the version scored) until
// it is named here, which is the moment to teach the store's script its
// term. The kv policy only; the credit's weights are settled because the
// Go side turns them into each choice's fixed Credit, and the cost's
// constants because ChoiceCost carries them; the other policies' fields
// never enter the kv cost. CreditDecay is refused at any value but 0: the
// credit it decays depends on every candidate's load, not only the
// chosen one's. (The comparison with Config{} needs Config comparable: a
// field that is not fails to compile here, also the moment to look.)
func Settleable(cfg Config) bool {
	if cfg.Policy != PolicyKV && cfg.Policy != "" {
		return false
	}
	rest := cfg
	rest.Policy = ""
	rest.OverlapCredit, rest.HostWeight, rest.ApproxWeight, rest.PredictWeight = 0, 0, 0, 0 // in Choice.Credit
	rest.PrefillLoadScale, rest.DecodeRequestWeight = 0, 0                                  // in ChoiceCost
	rest.BalanceAbs, rest.BalanceRel, rest.CacheThreshold = 0, 0, 0                         // hard-switch's
	rest.VirtualNodes = 0                                                                   // session's
	return rest == Config{}
}

// Settlement is a booking left to the store: the candidates it may land
// on, the pick first, and what the store costs them by.
type Settlement struct {
	// Cands indexes the candidates scored, in the order of Choices.
	Cands   []int
	Choices []kvroute.Choice
	Cost    kvroute.ChoiceCost
}

// Settle is the booking of res's pick left to the store: the pick and its
// SettleChoices-1 nearest eligible rivals by cost, each choice's prefill
// and credit, and the cost's constants, with the bound the winner must stay
// under (the cheapest rival left out, infinite when none is). req is the
// request as scored; its ActiveBlocks is the decode the lease books. ok is
// false when the store cannot settle it: cfg is not Settleable, the pick
// has no rival, or a rival left out is within a tie of the pick, which the
// store could not weigh.
func Settle(cfg Config, req Request, res Result) (Settlement, bool) {
	scores, pick := res.Scores, res.Pick
	if !Settleable(cfg) || pick < 0 || pick >= len(scores) {
		return Settlement{}, false
	}
	others := make([]int, 0, len(scores))
	for i, s := range scores {
		if s.Eligible && i != pick {
			others = append(others, i)
		}
	}
	if len(others) == 0 {
		return Settlement{}, false // nothing to settle between
	}
	slices.SortStableFunc(others, func(a, b int) int { return cmp.Compare(scores[a].Cost, scores[b].Cost) })
	n := min(len(others), SettleChoices-1)
	bound := math.Inf(1)
	if n < len(others) {
		bound = scores[others[n]].Cost
		if !(scores[pick].Cost < bound-SettleEps) {
			return Settlement{}, false
		}
	}
	st := Settlement{Cands: append([]int{pick}, others[:n]...)}
	st.Choices = make([]kvroute.Choice, len(st.Cands))
	for j, i := range st.Cands {
		s := scores[i]
		st.Choices[j] = kvroute.Choice{Replica: s.ID, PrefillBlocks: s.Owed, Credit: s.Credited, Floor: s.Floor, Held: s.Held}
	}
	st.Cost = kvroute.ChoiceCost{PrefillScale: cfg.PrefillLoadScale, RequestWeight: cfg.DecodeRequestWeight,
		Blocks: float64(req.Blocks), Active: req.ActiveBlocks, Bound: bound, Eps: SettleEps,
		OverlapCredit: cfg.OverlapCredit, PredictWeight: cfg.PredictWeight}
	return st, true
}

// PrefillOwed is the prefill a booking on s's replica owes: the request's
// prompt blocks less what the cost credited, not the raw overlap (a host-tier or
// approximate block is worth a fraction of a GPU block there), so that the
// booking agrees with the cost the pick was made on.
func PrefillOwed(blocks int, matched float64) int64 {
	return max(int64(blocks)-int64(matched), 0)
}

// Settled is the store's settlement in Go: the index of the choice a
// booking lands on at loads (one per choice, as they are now), or -1 when
// the cheapest is not under c.Bound. The cheapest by more than c.Eps wins,
// then the less loaded (prefill plus decode) by more than c.Eps, then the
// earlier choice. The in-memory store settles with it;
// store/lua/reservebest.lua is its copy in Lua.
func Settled(c kvroute.ChoiceCost, choices []kvroute.Choice, loads []kvroute.Load) int {
	best, bestCost, bestBlocks := -1, 0.0, 0.0
	for j, ch := range choices {
		cost := ChoiceCostAt(c, ch, loads[j])
		blocks := float64(loads[j].PrefillBlocks + loads[j].DecodeBlocks)
		if best < 0 || cost < bestCost-c.Eps || (math.Abs(cost-bestCost) <= c.Eps && blocks < bestBlocks-c.Eps) {
			best, bestCost, bestBlocks = j, cost, blocks
		}
	}
	if best < 0 || !(bestCost < c.Bound-c.Eps) {
		return -1
	}
	return best
}

// ChoiceCostAt is the kv cost of booking ch at load l: Pick's cost of that
// replica (the same function, so the same bits) with the request's terms
// and the choice's credit as Settle fixed them.
func ChoiceCostAt(c kvroute.ChoiceCost, ch kvroute.Choice, l kvroute.Load) float64 {
	return kvCost(c.PrefillScale, c.RequestWeight, LoadOf(l), c.Blocks, c.Active, ch.Credit, ch.Floor).cost
}

// ActiveRequests is the requests a replica is charged for: the larger of
// what routers booked and what the engine reports running or waiting, so
// that traffic bypassing kvroute still counts. The router scores with it,
// and store/lua/reservebest.lua's cost function mirrors it.
func ActiveRequests(l kvroute.Load) float64 {
	return float64(max(l.Requests, l.Running+l.Waiting))
}

// LoadOf is what scoring sees of a replica's stored load: the router and
// the in-memory store both convert through it, so that a term added to Load
// reaches every caller at once.
func LoadOf(l kvroute.Load) Load {
	return Load{Prefill: float64(l.PrefillBlocks), Decode: float64(l.DecodeBlocks), Requests: ActiveRequests(l)}
}

// kvTerms is one replica's kv cost and its parts.
type kvTerms struct {
	raw, adjusted, decode, reqs, cost float64
}

// kvCost is the kv cost, the one place it is written in Go: prefill owed
// after the credit, scaled, plus the decode owed, plus the requests
// weighed. Every product is rounded on its own (an explicit conversion
// stops the compiler fusing it into the sum, as it does on arm64): the
// store's booking script computes the same cost operation by operation and
// must land on the same bits.
func kvCost(scale, weight float64, l Load, blocks, active, credit, floor float64) kvTerms {
	raw := l.Prefill + blocks
	// The credit forgives queued prefill, never the request's own (floor:
	// its prefill owed, and the part of an in-flight prefill it would wait
	// for that computes nothing it needs). Without the floor every replica
	// holding a quarter of the prompt (at credit 4) costs the same as the
	// one holding all of it, and a returning session goes wherever decode
	// is lightest.
	adjusted := max(floor, raw-credit)
	decode := l.Decode + active
	reqs := float64(weight * l.Requests)
	return kvTerms{raw: raw, adjusted: adjusted, decode: decode, reqs: reqs, cost: float64(scale*adjusted) + decode + reqs}
}
