package store

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute"
)

// Late bookings. A booking whose reply does not come within its caller's
// deadline is given up (the decision is answered degraded), but it may
// still run: a primary that was frozen or stalled runs what waited in its
// sockets when it resumes, and the load it books then stands, unreleased
// by anyone, until its lease expires, steering decisions away from the
// replica (a prefix's holder) that it names. So every booking carries the
// Redis time after which it is not made, its caller's deadline plus
// lateBooking, and the scripts compare it with Redis's own clock (TIME).
//
// That trusts the pod's clock and Redis's to agree within lateBooking, as
// lease expiries already trust the pods' and the ingestors'. A booking
// refused as late while its caller still waited says they do not: the
// store says so, books it again without the limit, and sends no limit for
// lateOff (a clock stepped once, by NTP, is right again by then; one that
// is wrong is said again each time).

// lateBooking is how long after its caller's deadline a booking may still
// be made: well over the clock error of hosts kept by NTP, and well under
// the leases' lifetime.
const lateBooking = time.Second

// lateOff is how long bookings go without the limit after one was refused
// as late while its caller waited.
const lateOff = time.Minute

// lateClock is the Store's state for late bookings.
type lateClock struct {
	// offUntil (Unix ns, Store.now) ends the window in which bookings
	// carry no limit: this pod's clock and Redis's were found apart.
	offUntil atomic.Int64
}

// notAfter is the not_after_ms argument of a booking sent under ctx: its
// deadline plus lateBooking in Unix ms, or "0" (no limit) when ctx has no
// deadline or the limit is off.
func (s *Store) notAfter(ctx context.Context) string {
	d, ok := ctx.Deadline()
	if !ok || s.now().UnixNano() < s.late.offUntil.Load() {
		return "0"
	}
	return strconv.FormatInt(d.Add(lateBooking).UnixMilli(), 10)
}

// statusLate is the booking scripts' answer to a booking past its limit.
const statusLate = 3

// statusQueue and statusNoRoom are their answers to a booking under
// admission that must queue, or whose replicas have no room (lua/admit.lua).
const (
	statusQueue  = 4
	statusNoRoom = 5
)

// errLate is a booking refused as late (its caller had given up on it): as
// good as a store that did not answer.
var errLate = fmt.Errorf("%w: the booking reached Redis after its deadline and was not made", kvroute.ErrUnavailable)

// evalBooking runs a booking script sc for model with args, whose element
// at lateArg is set here to the booking's limit. A booking refused as late
// although its caller is still waiting turns the limit off and is sent
// again without it.
func (s *Store) evalBooking(ctx context.Context, model string, sc *redis.Script, args []any, lateArg int) ([]any, error) {
	args[lateArg] = s.notAfter(ctx)
	v, err := s.evalBatched(ctx, model, sc, leaseKeys(model), args...).Slice()
	if err != nil || len(v) < 1 || asInt(v[0]) != statusLate || ctx.Err() != nil {
		return v, err
	}
	now := s.now().UnixNano()
	if prev := s.late.offUntil.Load(); prev <= now && s.late.offUntil.CompareAndSwap(prev, now+int64(lateOff)) {
		s.log.Error("a booking reached Redis after its deadline while its caller still waited: this host's clock and Redis's disagree by more than the limit; bookings go without it for a while",
			"limit", lateBooking, "for", lateOff, "model", model)
	}
	args[lateArg] = "0"
	return s.evalBatched(ctx, model, sc, leaseKeys(model), args...).Slice()
}
