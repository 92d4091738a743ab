package router

import (
	"cmp"
	"math"
	"slices"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scoring"
)

// Settling a booking in the store. Decisions in flight together read the
// same loads and mostly pick the same replica; booked on the version they
// scored, all but the first lose, score again and retry, each retry a
// round trip, a script and often a re-read of every load (at one shard's
// ceiling 1.5 lost races a decision at 64 × 2,048, 2.3 at 8 × 64). Under
// the kv cost the store can settle that itself: the decision hands it its
// pick and the next cheapest candidates, and the store books whichever is
// cheapest by the loads as they are when the booking runs, one decision
// after another (reservebest.lua). On unchanged loads that is the pick, so
// a decision alone books exactly what it would have; in a burst each books
// what the same decision made a moment later, in sequence, would.

// settleChoices is how many candidates a booking leaves to the store: the
// pick and the next cheapest. A burst rarely moves a pick further than a
// few places, and the store costs each one it is given: with 8 the script
// took 34–41 µs of Redis a decision at one shard's ceiling, with 4 27–33,
// and the 3% of bookings it then refused (the cheapest had grown past
// the fifth) cost less than that.
const settleChoices = 4

// settleEps is scoring's tie tolerance.
const settleEps = 1e-9

// settle is the booking Reserve would make, left to the store: the
// candidates it may land on (cands indexes in.Candidates, in the order
// given to the store, the pick first), their choices and the cost. ok is
// false when the store cannot settle this decision: a policy other than
// kv, a credit that decays with load (it depends on every candidate's
// load, not only the chosen one's), or an outside candidate within a tie
// of the pick, which the store could not weigh.
func (r *Router) settle(in Input, out Outcome) (cands []int, choices []kvroute.Choice, cost kvroute.ChoiceCost, ok bool) {
	sc := r.cfg.Scoring
	if in.Policy != "" {
		sc.Policy = in.Policy
	}
	scores := out.Result.Scores
	if (sc.Policy != scoring.PolicyKV && sc.Policy != "") || sc.CreditDecay != 0 ||
		len(scores) != len(in.Candidates) || out.Pick < 0 || out.Pick >= len(scores) {
		return nil, nil, cost, false
	}
	others := make([]int, 0, len(scores))
	for i, s := range scores {
		if s.Eligible && i != out.Pick {
			others = append(others, i)
		}
	}
	if len(others) == 0 {
		return nil, nil, cost, false // nothing to settle between
	}
	slices.SortStableFunc(others, func(a, b int) int { return cmp.Compare(scores[a].Cost, scores[b].Cost) })
	n := min(len(others), settleChoices-1)
	bound := math.Inf(1)
	if n < len(others) {
		bound = scores[others[n]].Cost
		if !(scores[out.Pick].Cost < bound-settleEps) {
			return nil, nil, cost, false
		}
	}
	cands = append([]int{out.Pick}, others[:n]...)
	choices = make([]kvroute.Choice, len(cands))
	for j, i := range cands {
		s := scores[i]
		choices[j] = kvroute.Choice{Replica: in.Candidates[i].ID, PrefillBlocks: max(int64(in.Blocks)-int64(s.Matched), 0), Credit: s.Credit * s.Matched}
	}
	// The request's own terms, as scoringInput gives them to scoring: its
	// blocks, and the decode it books (the lease's) as active blocks.
	cost = kvroute.ChoiceCost{PrefillScale: sc.PrefillLoadScale, RequestWeight: sc.DecodeRequestWeight,
		Blocks: float64(in.Blocks), Active: float64(out.Lease.DecodeBlocks), Bound: bound, Eps: settleEps}
	return cands, choices, cost, true
}
