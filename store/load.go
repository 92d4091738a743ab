package store

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/redis/go-redis/v9"
)

// sweepBatch bounds one sweep script so that a backlog of expired leases
// never blocks Redis for long; SweepExpired loops until it is drained.
const sweepBatch = 500

// Reserve books lease on lease.Replica if that replica's load Version still
// equals ifVersion (ifVersion < 0 books unconditionally). When the version
// moved on, nothing is booked and cur is the replica's current load, so the
// caller can score again. A request id that already holds a lease is not
// booked twice: Reserve reports booked=true (a retry of a booking that went
// through).
//
// lease.RequestID must have been minted for lease.Model (NewRequestID):
// Advance and Release find the lease's model, and so its keys, from the
// id, so a decision costs one script call in its model's slot.
func (s *Store) Reserve(ctx context.Context, lease kvroute.Lease, ifVersion int64) (booked bool, cur kvroute.Load, err error) {
	return s.reserve(ctx, lease, ifVersion, nil)
}

// ReserveWithin books lease if the replica's booked load is at most max in
// each of its counters (prefill blocks, decode blocks, requests), whatever
// its version: a decision that lost a booking race, and whose pick wins at
// any load up to max, books it without racing again. Otherwise it returns
// the current load, as Reserve does.
func (s *Store) ReserveWithin(ctx context.Context, lease kvroute.Lease, max kvroute.Load) (booked bool, cur kvroute.Load, err error) {
	return s.reserve(ctx, lease, -1, &max)
}

// checkLease rejects a lease no booking script may be given.
func checkLease(lease kvroute.Lease) error {
	var fe *kvroute.FieldError
	switch {
	case lease.RequestID == "":
		fe = &kvroute.FieldError{Field: "request_id", Msg: "is required"}
	case lease.Model == "" || lease.Replica == "":
		fe = &kvroute.FieldError{Field: "replica", Msg: "and model are required"}
	case lease.PrefillBlocks < 0 || lease.DecodeBlocks < 0:
		fe = &kvroute.FieldError{Field: "blocks", Msg: "must not be negative"}
	}
	if m, ok := RequestModel(lease.RequestID); fe == nil && (!ok || m != lease.Model) {
		fe = &kvroute.FieldError{Field: "request_id", Msg: "must be minted for the lease's model (store.NewRequestID)"}
	}
	if fe != nil {
		return fmt.Errorf("store: reserve: %w", fe)
	}
	return nil
}

func (s *Store) reserve(ctx context.Context, lease kvroute.Lease, ifVersion int64, within *kvroute.Load) (booked bool, cur kvroute.Load, err error) {
	if err := checkLease(lease); err != nil {
		return false, cur, err
	}
	args := []any{lease.RequestID, lease.Replica,
		strconv.FormatInt(lease.PrefillBlocks, 10), strconv.FormatInt(lease.DecodeBlocks, 10),
		strconv.FormatInt(ms(lease.Expires), 10), strconv.FormatInt(ifVersion, 10), nil, s.admitArg(lease)}
	args = append(args, s.predictArgs(lease)...)
	if within != nil {
		args = append(args, strconv.FormatInt(within.PrefillBlocks, 10),
			strconv.FormatInt(within.DecodeBlocks, 10), strconv.FormatInt(within.Requests, 10))
	}
	v, err := s.evalBooking(ctx, lease.Model, scriptReserve, args, 6)
	if err != nil {
		return false, cur, wrap("reserve", err)
	}
	if len(v) < 1 {
		return false, cur, fmt.Errorf("store: reserve: unexpected reply %v", v)
	}
	if asInt(v[0]) == statusLate {
		return false, cur, fmt.Errorf("store: reserve: %w", errLate)
	}
	if st := asInt(v[0]); st == statusQueue || st == statusNoRoom {
		return false, cur, fmt.Errorf("store: reserve: %w", kvroute.ErrNoRoom)
	}
	var booked1, scraped any
	if len(v) > 1 {
		booked1 = v[1]
	}
	if len(v) > 2 {
		scraped = v[2]
	}
	if cur, err = parseLoad(booked1, scraped); err != nil {
		return false, cur, fmt.Errorf("store: reserve: %w", err)
	}
	if asInt(v[0]) == 1 && len(v) > 3 {
		s.countBooked(ctx, lease, asInt(v[3]))
	}
	return asInt(v[0]) != 0, cur, nil
}

// countBooked counts a booking's prediction (written, when it carried
// one) and the expired ones its script dropped.
func (s *Store) countBooked(ctx context.Context, lease kvroute.Lease, expired int) {
	if lease.Predict != nil && len(lease.Predict.Marks) > 0 {
		s.countPredictions(ctx, PredictWritten, 1)
	}
	s.countPredictions(ctx, PredictExpired, int64(expired))
}

// Advance marks the request's first token: its prefill blocks are released,
// its decode blocks stay booked. It reports whether anything changed; a
// second call, or a call for an unknown or released request (or an id not
// minted by NewRequestID), is a no-op.
func (s *Store) Advance(ctx context.Context, requestID string) (bool, error) {
	return s.unbook(ctx, "advance", scriptAdvance, requestID)
}

// Release ends the request: everything its lease booked is released. It
// reports false for an unknown or already released request.
func (s *Store) Release(ctx context.Context, requestID string) (bool, error) {
	return s.unbook(ctx, "release", scriptRelease, requestID)
}

func (s *Store) unbook(ctx context.Context, op string, sc *redis.Script, id string) (bool, error) {
	model, ok := RequestModel(id)
	if !ok {
		return false, nil // not one of ours: no lease was booked under it
	}
	v, err := s.evalBatched(ctx, model, sc, leaseKeys(model), id, s.nowMs()).Slice()
	if err != nil {
		return false, wrap(op, err)
	}
	if len(v) != 2 {
		return false, fmt.Errorf("store: %s: unexpected reply %v", op, v)
	}
	s.countPredictions(ctx, PredictWithdrawn, int64(asInt(v[1])))
	return asInt(v[0]) == 1, nil
}

// SweepExpired releases the model's leases whose expiry is before Now: the
// bookings of scoring pods that died mid-request. It returns how many it
// released. It also drops expired approximate entries (see SweepApprox), so
// that the ingestor's one sweeper bounds both.
func (s *Store) SweepExpired(ctx context.Context, model string) (int, error) {
	total := 0
	now := strconv.FormatInt(ms(s.now()), 10)
	for {
		v, err := scriptSweep.Run(ctx, s.c, leaseKeys(model), now, sweepBatch).Slice()
		if err != nil {
			return total, wrap("sweep", err)
		}
		if len(v) != 3 {
			return total, fmt.Errorf("store: sweep: unexpected reply %v", v)
		}
		s.countPredictions(ctx, PredictWithdrawn, int64(asInt(v[2])))
		seen := asInt(v[0])
		done, _ := v[1].([]any)
		ids := make([]string, 0, len(done))
		for _, d := range done {
			if id, ok := d.(string); ok {
				ids = append(ids, id)
			}
		}
		total += len(ids)
		if seen < sweepBatch {
			// Expired approximate entries are dropped on the same beat.
			if _, err := s.SweepApprox(ctx, model); err != nil {
				return total, err
			}
			return total, nil
		}
	}
}

// Loads returns each replica's load, in order; a replica with no bookings
// and no scrape has a zero Load.
func (s *Store) Loads(ctx context.Context, model string, replicas []string) ([]kvroute.Load, error) {
	if len(replicas) == 0 {
		return nil, nil
	}
	cmd := hmget(ctx, loadKey(model), loadPairs(replicas, 0))
	if err := s.batcher(model).do(ctx, cmd); err != nil {
		return nil, wrap("loads", err)
	}
	return parseLoads("loads", cmd.Val(), replicas)
}

// loadPairs are every replica's booked and scraped load fields, in order,
// with room for extra more.
func loadPairs(replicas []string, extra int) []string {
	fields := make([]string, 0, 2*len(replicas)+extra)
	for _, r := range replicas {
		fields = append(fields, r, r+"#s")
	}
	return fields
}

// parseLoads decodes loadPairs' values, the replicas' loads in order.
func parseLoads(op string, v []any, replicas []string) ([]kvroute.Load, error) {
	out := make([]kvroute.Load, len(replicas))
	for i := range out {
		var err error
		if out[i], err = parseLoad(v[2*i], v[2*i+1]); err != nil {
			return nil, fmt.Errorf("store: %s: %s: %w", op, replicas[i], err)
		}
	}
	return out, nil
}

// SetScraped records what the replica's /metrics said. It is kept apart
// from booked load (field "<replica>#s") so that a scrape never races a
// booking and needs no script.
func (s *Store) SetScraped(ctx context.Context, model, replica string, waiting, running int64, kvUsage float64) error {
	v := strconv.FormatInt(waiting, 10) + "," + strconv.FormatInt(running, 10) + "," + strconv.FormatFloat(kvUsage, 'g', -1, 64) +
		"," + strconv.FormatInt(ms(s.now()), 10)
	// '#ht' keeps the load hash a hash table (see slotOf in lua/lib.lua).
	return wrap("set scraped", s.c.HSet(ctx, loadKey(model), replica+"#s", v, "#ht", htPad).Err())
}

// htPad is longer than any server's hash-max-listpack-value default (64).
var htPad = strings.Repeat("-", 80)

// parseLoad decodes a booked value "prefill,decode,requests,version" and a
// scraped value "waiting,running,kvusage,ms"; either may be absent (nil). It
// runs for every candidate of every decision, so it splits in place.
func parseLoad(booked, scraped any) (kvroute.Load, error) {
	var l kvroute.Load
	if b, ok := booked.(string); ok {
		rest := b
		for i, p := range []*int64{&l.PrefillBlocks, &l.DecodeBlocks, &l.Requests, &l.Version} {
			f, more, found := strings.Cut(rest, ",")
			if found != (i < 3) {
				return l, fmt.Errorf("bad load %q", b)
			}
			var err error
			if *p, err = strconv.ParseInt(f, 10, 64); err != nil {
				return l, fmt.Errorf("bad load %q: %w", b, err)
			}
			rest = more
		}
	}
	if sc, ok := scraped.(string); ok {
		w, rest, ok1 := strings.Cut(sc, ",")
		r, kv, ok2 := strings.Cut(rest, ",")
		// A fourth field is the scrape's time (ms); values written before
		// it was kept have none.
		kv, at, timed := strings.Cut(kv, ",")
		if !ok1 || !ok2 || strings.Contains(at, ",") {
			return l, fmt.Errorf("bad scraped load %q", sc)
		}
		if timed {
			t, err := strconv.ParseInt(at, 10, 64)
			if err != nil {
				return l, fmt.Errorf("bad scraped load %q: %w", sc, err)
			}
			l.ScrapedAt = time.UnixMilli(t)
		}
		var err error
		if l.Waiting, err = strconv.ParseInt(w, 10, 64); err != nil {
			return l, fmt.Errorf("bad scraped load %q: %w", sc, err)
		}
		if l.Running, err = strconv.ParseInt(r, 10, 64); err != nil {
			return l, fmt.Errorf("bad scraped load %q: %w", sc, err)
		}
		if l.KVUsage, err = strconv.ParseFloat(kv, 64); err != nil {
			return l, fmt.Errorf("bad scraped load %q: %w", sc, err)
		}
	}
	return l, nil
}
