package router

import (
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
// what the same decision made a moment later, in sequence, would. What is
// handed over, and whether the store can settle a configuration at all,
// is scoring's (scoring/settle.go): the cost lives there.

// settle is the booking Reserve would make, left to the store (see
// scoring.Settle): ok is false when the store cannot settle this decision.
func (r *Router) settle(in Input, out Outcome) (scoring.Settlement, bool) {
	sreq := scoring.Request{Blocks: in.Blocks, ActiveBlocks: float64(out.Lease.DecodeBlocks)}
	return scoring.Settle(scoringConfig(r.cfg, in), sreq, out.Result)
}
