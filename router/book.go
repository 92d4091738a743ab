package router

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scoring"
	"go.opentelemetry.io/otel/attribute"
)

// Under the kv cost the store settles a booking (settle.go). Otherwise a
// decision books its pick at any load up to where it would stop winning
// (Slack), or on the load's version as scored when it has no margin. One
// that lost a booking race scores again with the contested replica's
// fresh load; if the pick stays, it books it within its new slack, and if
// the pick moves, it re-reads every load and scores again. It does so up
// to maxBookingAttempts times or for bookingBudget, then books regardless:
// under the kv cost, still settled by the store, on the cheapest of its
// choices as the loads are then.
// Retrying until the race is won is what makes a burst of simultaneous
// decisions from many pods place exactly as the same decisions in
// sequence (64 over two pods: 43 of 64 on the prompt's holder either way);
// booking regardless after a few attempts placed 8% fewer there on
// average. The bounds keep a pathological contention from holding a
// decision long: each retry costs two round trips.
const (
	maxBookingAttempts = 64
	bookingBudget      = 250 * time.Millisecond
)

// book scores in and books the pick, through lost booking races: loads
// and ids are the candidates' loads as read and what the index knows them by. A store that
// fails the reservation is an error wrapping kvroute.ErrUnavailable (the
// caller answers degraded).
func (r *Router) book(ctx context.Context, model string, in Input, loads []kvroute.Load, ids candidates, tm *Stages) (Outcome, error) {
	started := r.now()
	out, err := r.decide(ctx, model, in, tm)
	if err != nil {
		return out, err
	}
	// within bounds the pick's load at which it still wins (nil: book on
	// the version scored). It is worked out only for a booking the store
	// does not settle: slackDue says the pick's slack at its load as read
	// is still to be found.
	var within *kvroute.Load
	slackDue, forcedSettle := true, false
	for attempt := 0; ; attempt++ {
		// Out of attempts or time the booking goes through regardless: a
		// decision must finish, and its view is at most a few bookings
		// stale.
		p := out.Pick
		ifVersion := loads[p].Version
		force := attempt >= maxBookingAttempts || r.now().Sub(started) > bookingBudget
		if force {
			ifVersion, within, slackDue = -1, nil, false
		}
		// A merged candidate's load is several entries' the store does
		// not add up: it is booked on the version scored instead. A
		// forced settlement is tried once.
		if st, ok := r.settle(in, out); ok && !ids.merged() && !forcedSettle {
			forcedSettle = force
			if o, done, err := r.bookSettled(ctx, in, loads, out, unbounded(st, force), attempt, tm); done {
				return o, err
			}
			// The cheapest of them was not under the cheapest left out:
			// read every load and score again.
		} else {
			if slackDue {
				within, slackDue = r.slack(in, out, loads[p]), false
			}
			booked, cur, err := r.reserve(ctx, out, ifVersion, within, attempt, tm)
			if err != nil {
				return out, reserveErr(err)
			}
			if booked {
				return out, nil
			}
			// Another pod booked first: a burst is under way. The refusal
			// carries this replica's load as it is now: score again with
			// it. If the pick stays (the common case: losing the race did
			// not change which replica is cheapest, and in a burst the
			// others' loads only grow), book it again at once.
			loads[p] = cur
			in.Candidates[p].Load = scoring.LoadOf(cur)
			if out, err = r.decide(ctx, model, in, tm); err != nil {
				return out, err
			}
			if out.Pick == p {
				// Book it at any load up to where it would stop winning,
				// so that the next attempt does not lose to the next
				// booking.
				within = r.slack(in, out, cur)
				continue
			}
		}
		within = nil
		// The pick moves: every candidate's load may have moved, not only
		// this one's. Re-read them all and score again, so that the burst
		// places as the same decisions made one after another would.
		fresh, ok := r.reread(ctx, model, in, ids, len(loads), tm)
		if !ok {
			continue // book the pick made on what is known
		}
		loads = fresh
		if out, err = r.decide(ctx, model, in, tm); err != nil {
			return out, err
		}
		slackDue = true
	}
}

// unbounded is st with no bound when force is set: a booking out of
// attempts or time is still settled by the store, on the cheapest of its
// choices whatever the rivals left out cost. Booking the pick as scored
// would ignore what the bookings made since the lookup wrote, the
// predictions of a burst's first bookings above all (on a busy machine a
// burst's decisions pass bookingBudget before their first attempt, and
// every one of them then booked the replica its lookup saw least loaded).
func unbounded(st scoring.Settlement, force bool) scoring.Settlement {
	if force {
		st.Cost.Bound = math.Inf(1)
	}
	return st
}

// decide scores in, as the decision's scoring stage.
func (r *Router) decide(ctx context.Context, model string, in Input, tm *Stages) (Outcome, error) {
	_, st := r.stage(ctx, "kvroute.scoring", &tm.Scoring)
	r.mu.Lock()
	out, err := Decide(r.cfg, in, r.rng)
	r.mu.Unlock()
	st.end(err)
	if errors.Is(err, scoring.ErrNoCandidate) {
		return out, fmt.Errorf("router: model %q: every replica is unhealthy: %w", model, kvroute.ErrNoReplica)
	}
	if err != nil {
		return out, fmt.Errorf("router: %w", err)
	}
	return out, nil
}

// reread reads every candidate's load again and writes it to in; ok is
// false when the store did not answer n of them, and the booking goes on
// with what is known.
func (r *Router) reread(ctx context.Context, model string, in Input, ids candidates, n int, tm *Stages) ([]kvroute.Load, bool) {
	lctx, st := r.stage(ctx, "kvroute.loads", &tm.Reserve)
	sctx, cancel := r.storeCtx(lctx)
	fresh, err := r.idx.Loads(sctx, model, ids.ids)
	cancel()
	st.end(err)
	fresh = ids.foldLoads(fresh)
	if err != nil || len(fresh) != n {
		return nil, false
	}
	for i := range in.Candidates {
		in.Candidates[i].Load = scoring.LoadOf(fresh[i])
	}
	return fresh, true
}

// bookSettled leaves the booking to the store and answers the Outcome of
// what it booked. done is false when it booked nothing (the cheapest of
// the choices was not under the cheapest left out); the loads it found
// are then in loads and in.
func (r *Router) bookSettled(ctx context.Context, in Input, loads []kvroute.Load, out Outcome, st scoring.Settlement, attempt int, tm *Stages) (o Outcome, done bool, err error) {
	j, err := r.reserveBest(ctx, in, loads, out, st, attempt, tm)
	switch {
	case err != nil:
		return out, true, reserveErr(err)
	case j == out.Pick:
		return out, true, nil
	case j >= 0:
		o, err := DecideAs(r.cfg, in, j)
		if err != nil {
			return out, true, fmt.Errorf("router: %w", err)
		}
		return o, true, nil
	}
	return out, false, nil
}

// lease is what out books: under admission, only where there is room.
func (r *Router) lease(out Outcome) kvroute.Lease {
	l := out.Lease
	l.Admit = l.Admit || r.adm != nil
	return l
}

// reserve books out's lease on its pick, on the load's version as scored
// (any when ifVersion < 0) or within bounds.
func (r *Router) reserve(ctx context.Context, out Outcome, ifVersion int64, within *kvroute.Load, attempt int, tm *Stages) (bool, kvroute.Load, error) {
	rctx, st := r.stage(ctx, "kvroute.reserve", &tm.Reserve)
	sctx, cancel := r.storeCtx(rctx)
	defer cancel()
	var booked bool
	var cur kvroute.Load
	var err error
	if within != nil {
		booked, cur, err = r.idx.ReserveWithin(sctx, r.lease(out), *within)
	} else {
		booked, cur, err = r.idx.Reserve(sctx, r.lease(out), ifVersion)
	}
	st.end(err, attribute.String("kvroute.replica", out.Lease.Replica), attribute.Bool("kvroute.booked", booked), attribute.Int("kvroute.attempt", attempt))
	return booked, cur, err
}

// reserveBest leaves the booking to the store (settle.go) and returns the
// candidate it booked (an index of in.Candidates), or -1 when it booked
// none. The loads the store found are written to loads and in: they are
// the freshest there are.
func (r *Router) reserveBest(ctx context.Context, in Input, loads []kvroute.Load, out Outcome, settle scoring.Settlement, attempt int, tm *Stages) (int, error) {
	cands, choices := settle.Cands, settle.Choices
	rctx, st := r.stage(ctx, "kvroute.reserve", &tm.Reserve)
	sctx, cancel := r.storeCtx(rctx)
	defer cancel()
	j, cur, err := r.idx.ReserveBest(sctx, r.lease(out), choices, settle.Cost)
	booked := ""
	if err == nil && j >= 0 && j < len(choices) {
		booked = choices[j].Replica
	}
	st.end(err, attribute.String("kvroute.replica", booked), attribute.Bool("kvroute.booked", booked != ""),
		attribute.Int("kvroute.attempt", attempt), attribute.Int("kvroute.choices", len(choices)))
	if err != nil {
		return -1, err
	}
	if len(cur) == len(cands) {
		for k, i := range cands {
			loads[i] = cur[k]
			in.Candidates[i].Load = scoring.LoadOf(cur[k])
		}
	}
	if booked == "" {
		return -1, nil
	}
	return cands[j], nil
}

// reserveErr is a failed booking as the router returns it: an unreachable
// store as the store said it (the degraded reason quotes it).
func reserveErr(err error) error {
	if errors.Is(err, kvroute.ErrUnavailable) {
		return err
	}
	return fmt.Errorf("router: reserve: %w", err)
}

// slack bounds the pick's load (cur, the load it was scored with) at which
// booking it is still the decision made: up to Slack more bookings like
// this one. It is nil when the pick wins only by a tie-break or the policy
// is not a cost policy; the booking then goes through only on the load's
// version as scored.
//
// The bound is tried from the first booking on, not only after a lost
// race: decisions in flight together mostly pick the same replicas, and a
// booking checked on the version alone loses to every one of them that
// booked first, although its pick would have won at that load too. At
// one shard's ceiling (BenchmarkShardCeiling) scripts per decision fell
// from 3.27 to 2.67 at 8 × 64; at 64 × 2,048 from 2.73 to 2.54, where 85%
// of picks have no slack (the closed loop keeps the holders' costs within
// one booking of each other) and their races are real ones.
func (r *Router) slack(in Input, out Outcome, cur kvroute.Load) *kvroute.Load {
	k := int64(Slack(r.cfg, in, out))
	if k <= 0 {
		return nil
	}
	return &kvroute.Load{
		PrefillBlocks: cur.PrefillBlocks + k*out.Lease.PrefillBlocks,
		DecodeBlocks:  cur.DecodeBlocks + k*out.Lease.DecodeBlocks,
		Requests:      cur.Requests + k,
	}
}
