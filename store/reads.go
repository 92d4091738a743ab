package store

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Lookup reads on replicas. A decision's Redis time is the lookup's reads
// (the index probes and the load fields) and the booking script; only the
// booking must run on the primary. With Config.ReadReplicas the plain
// lookup reads go to a replica through batchers of their own (a shared
// pipeline is sent to a replica only when every command in it reads), and
// the primary is left the bookings, events and leases. A replica read has
// a budget of its own (readBudget, well inside the decision's), so that a
// replica that hangs or crawls leaves the decision time to ask the
// primary. A failed replica read is asked again of the primary at once,
// and the primary takes every lookup for readBackoff after it: a replica
// that is down, restarting or hung costs the decisions in flight when it
// fails one budget each, once a window. lookup.lua
// (a chain the hints do not prove) stays on the primary: it is the rarer
// path, and a script that only reads still needs EVAL_RO, which not every
// server kvroute supports has.

// readBackoff is how long lookups stay on the primary after a replica
// failed one.
const readBackoff = 5 * time.Second

// readBudget bounds a replica read: a healthy replica answers a lookup in
// a millisecond or two, and a decision's store calls get 250 ms by
// default, so most of it is left for the primary. A caller with less
// time left gives the replica half of it.
const readBudget = 50 * time.Millisecond

// replicaReads is the Store's read client and its state.
type replicaReads struct {
	c redis.UniversalClient // nil: reads go to the primary
	// downUntil is when a failed replica read's window ends (Unix ns).
	downUntil atomic.Int64
	// batches are the replica's batchers, one per model, as Store.batches.
	batches sync.Map
	// failed and served count the lookups whose replica read failed and
	// those it answered, for tests and the closing figures.
	failed, served atomic.Int64
}

// readBatcher returns model's batcher for lookup reads: a replica's, or
// the primary's when reads go there or the replica is in its window.
// replica reports which.
func (s *Store) readBatcher(model string) (b *batcher, replica bool) {
	r := &s.reads
	if r.c == nil || s.now().UnixNano() < r.downUntil.Load() {
		return s.batcher(model), false
	}
	if b, ok := r.batches.Load(model); ok {
		return b.(*batcher), true
	}
	nb, _ := r.batches.LoadOrStore(model, &batcher{c: r.c, max: coalesced})
	return nb.(*batcher), true
}

// readFailed opens the replica's window after a failed read.
func (s *Store) readFailed(err error) {
	r := &s.reads
	r.failed.Add(1)
	now := s.now()
	until := now.Add(readBackoff).UnixNano()
	for {
		prev := r.downUntil.Load()
		if prev >= until {
			return // a concurrent failure opened a later window
		}
		if r.downUntil.CompareAndSwap(prev, until) {
			if prev < now.UnixNano() {
				s.log.Warn("lookup reads go to the primary: the replica failed one", "for", readBackoff, "err", err)
			}
			return
		}
	}
}

// readVia sends the commands mk makes through model's read batcher, and
// when a replica fails them, or answers what check refuses, makes them
// again and sends them to the primary (a sent command cannot be sent
// twice). check runs only on a replica's answer; nil accepts any.
// replicaOK false sends them to the primary.
func (s *Store) readVia(ctx context.Context, model string, replicaOK bool, mk func() []redis.Cmder, check func() error) error {
	b, replica := s.readBatcher(model)
	budget := readBudget
	if d, ok := ctx.Deadline(); ok {
		budget = min(budget, time.Until(d)/2)
	}
	if !replica || !replicaOK || budget < time.Millisecond {
		return s.batcher(model).do(ctx, mk()...)
	}
	rctx, cancel := context.WithTimeout(ctx, budget)
	err := b.do(rctx, mk()...)
	cancel()
	if err == nil && check != nil {
		err = check()
	}
	if err == nil {
		s.reads.served.Add(1)
		return nil
	}
	if ctx.Err() != nil {
		return err
	}
	// A replica that missed a budget cut short by the caller's own
	// deadline is not taken for a failing one.
	if !(budget < readBudget && errors.Is(err, context.DeadlineExceeded)) {
		s.readFailed(err)
	}
	return s.batcher(model).do(ctx, mk()...)
}

// errReplicaEmpty is a replica's answer without a model the pod has seen
// slots for: a replica restarted empty and not yet synced (it serves its
// empty data set until then, unless replica-serve-stale-data is off).
var errReplicaEmpty = errors.New("the replica does not have the model's slots")

// ReplicaReads reports how many lookups the read client answered (a
// Cluster or Sentinel client may itself send one to a primary when no
// replica is up) and how many replica reads failed, Open's first ping
// included.
func (s *Store) ReplicaReads() (served, failed int64) {
	return s.reads.served.Load(), s.reads.failed.Load()
}
