package store

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute"
)

// ReserveBest books lease on the cheapest of choices by their loads as
// they are when it runs (cost, see kvroute.ChoiceCost): the lease's
// Replica and PrefillBlocks are the chosen one's. It returns the index of
// the choice booked, or -1 when the cheapest was not under cost.Bound
// (nothing booked), and every choice's current load so that the caller
// can score again; none (nil) when it booked the first choice, the
// caller's own pick. Scraped loads are read, and answered, only when
// cost.RequestWeight weighs requests. A request id that already holds a lease is
// not booked twice: the index is its replica's among the choices, or the
// error is ErrLeaseElsewhere when it is none of them.
func (s *Store) ReserveBest(ctx context.Context, lease kvroute.Lease, choices []kvroute.Choice, cost kvroute.ChoiceCost) (int, []kvroute.Load, error) {
	if len(choices) == 0 {
		return -1, nil, fmt.Errorf("store: reserve: %w", &kvroute.FieldError{Field: "replica", Msg: "is required: no choices"})
	}
	for _, c := range choices {
		l := lease
		l.Replica, l.PrefillBlocks = c.Replica, c.PrefillBlocks
		if err := checkLease(l); err != nil {
			return -1, nil, err
		}
	}
	num := func(f float64) string {
		// Exact (shortest round-trip) digits, finite, and a mantissa with
		// a point: the embedded server's Lua reads "1e-09" as no number.
		v := strconv.FormatFloat(max(min(f, math.MaxFloat64), -math.MaxFloat64), 'g', -1, 64)
		if i := strings.IndexByte(v, 'e'); i >= 0 && !strings.Contains(v[:i], ".") {
			v = v[:i] + ".0" + v[i:]
		}
		return v
	}
	// The cost's constants, in the order reservebest.lua's cost function
	// reads them (a settled cost term's weight joins them here).
	args := make([]any, 0, 16+4*len(choices))
	args = append(args, lease.RequestID, strconv.FormatInt(lease.DecodeBlocks, 10), strconv.FormatInt(ms(lease.Expires), 10),
		num(cost.PrefillScale), num(cost.RequestWeight), num(cost.Blocks), num(cost.Active), num(cost.Bound), num(cost.Eps), nil, s.admitArg(lease))
	args = append(args, s.predictArgs(lease)...)
	for _, c := range choices {
		args = append(args, c.Replica, strconv.FormatInt(c.PrefillBlocks, 10), num(c.Credit), num(c.Floor))
	}
	v, err := s.evalBooking(ctx, lease.Model, scriptReserveBest, args, 9)
	if err != nil {
		return -1, nil, wrap("reserve", err)
	}
	if len(v) >= 1 && asInt(v[0]) == statusLate {
		return -1, nil, fmt.Errorf("store: reserve: %w", errLate)
	}
	if len(v) >= 1 && asInt(v[0]) == statusQueue {
		return -1, nil, fmt.Errorf("store: reserve: %w", kvroute.ErrNoRoom)
	}
	// The last value is the expired predictions the booking dropped.
	if len(v) >= 3 && asInt(v[0]) == 1 {
		s.countBooked(ctx, lease, asInt(v[len(v)-1]))
	}
	if len(v) == 3 && asInt(v[0]) != 0 && asInt(v[1]) == 1 {
		return 0, nil, nil // the caller's own pick, as it scored it
	}
	if len(v) != 3+2*len(choices) {
		return -1, nil, fmt.Errorf("store: reserve: unexpected reply of %d values", len(v))
	}
	loads := make([]kvroute.Load, len(choices))
	for i := range loads {
		if loads[i], err = parseLoad(v[2+2*i], v[3+2*i]); err != nil {
			return -1, nil, fmt.Errorf("store: reserve: %s: %w", choices[i].Replica, err)
		}
	}
	switch status, index := asInt(v[0]), asInt(v[1]); {
	case status == 0:
		return -1, loads, nil
	case status == statusNoRoom:
		return -1, loads, fmt.Errorf("store: reserve: %w", kvroute.ErrNoRoom)
	case index < 1 || index > len(choices):
		// Only a retry of the same request with other choices gets here:
		// its lease is on a replica the caller no longer offers.
		return -1, loads, fmt.Errorf("store: reserve: %w", ErrLeaseElsewhere)
	default:
		return index - 1, loads, nil
	}
}

// ErrLeaseElsewhere is ReserveBest's answer for a request that already
// holds a lease on a replica that is none of the choices: nothing new is
// booked, and the caller cannot say where the request should go.
var ErrLeaseElsewhere = errors.New("the request already holds a lease on another replica")
