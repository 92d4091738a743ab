package router

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute"
)

// Progress reports (first token, release) must never hold a client up:
// a proxied stream's first byte, or a client's release call, should not
// wait out a hung store. Each is tried once within StoreTimeout; if the
// store is unreachable it is queued in process and retried in the
// background (Run) until it lands, the lease is gone, or the report is
// older than the longest lease could live. A lease that is never
// released still expires on its own: the queue only makes the load view
// right sooner.
//
// The retry comes when the report's back-off window closes, the moment
// decisions try the store again, not on a tick of its own: a released
// booking still in the store loads its replica, and every decision made
// between the store's return and the release's landing weighs that load
// (with an idle fleet, enough to send a prompt away from its holder).

// ErrQueued says a progress report could not reach the store now and was
// queued for retry; the caller may answer 202. It wraps
// kvroute.ErrUnavailable for callers that do not tell them apart.
var ErrQueued = fmt.Errorf("queued for retry: %w", kvroute.ErrUnavailable)

// progressKind is which report.
type progressKind uint8

const (
	reportFirstToken progressKind = iota
	reportRelease
)

type report struct {
	kind progressKind
	id   string
	at   time.Time
}

// progressQueue holds reports that could not reach the store, in order.
// A release supersedes the same request's first-token report.
type progressQueue struct {
	mu      sync.Mutex
	pending []report
	// wake tells Run that the queue has something again (it sleeps
	// otherwise); buffered, one signal.
	wake chan struct{}
	// inflight counts reports taken for a retry that has not finished.
	inflight int
	dropped  int
}

// maxQueued bounds the queue: past it the oldest reports are dropped
// (their leases expire on their own).
const maxQueued = 100_000

func (q *progressQueue) push(r report) {
	q.mu.Lock()
	if len(q.pending) == 0 {
		select {
		case q.wake <- struct{}{}:
		default:
		}
	}
	if r.kind == reportRelease {
		kept := q.pending[:0]
		for _, p := range q.pending {
			if p.id != r.id {
				kept = append(kept, p)
			}
		}
		q.pending = kept
	}
	q.pending = append(q.pending, r)
	if over := len(q.pending) - maxQueued; over > 0 {
		q.pending = append(q.pending[:0], q.pending[over:]...)
		q.dropped += over
	}
	q.mu.Unlock()
}

// requeue puts back reports a retry pass took and could not deliver, in
// one step (a push each would rescan the queue each time: quadratic in an
// outage's backlog, under the lock every report takes). They go before
// what was queued during the pass, which is newer; a first-token report
// whose request's release was queued meanwhile is dropped, as push drops
// it.
func (q *progressQueue) requeue(back []report) {
	if len(back) == 0 {
		return
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	released := map[string]bool{}
	for _, p := range q.pending {
		if p.kind == reportRelease {
			released[p.id] = true
		}
	}
	merged := make([]report, 0, len(back)+len(q.pending))
	for _, b := range back {
		if b.kind == reportFirstToken && released[b.id] {
			continue
		}
		merged = append(merged, b)
	}
	q.pending = append(merged, q.pending...)
	if over := len(q.pending) - maxQueued; over > 0 {
		q.pending = append(q.pending[:0], q.pending[over:]...)
		q.dropped += over
	}
}

// take hands every pending report to a retry, which settles each.
func (q *progressQueue) take() []report {
	q.mu.Lock()
	defer q.mu.Unlock()
	out := q.pending
	q.pending = nil
	q.inflight += len(out)
	return out
}

// settle ends n taken reports' retry: delivered, expired, or pushed back.
func (q *progressQueue) settle(n int) {
	q.mu.Lock()
	q.inflight -= n
	q.mu.Unlock()
}

// Queued is how many progress reports have not reached the store yet:
// waiting for a retry, or being retried.
func (r *Router) Queued() int {
	r.progress.mu.Lock()
	defer r.progress.mu.Unlock()
	return len(r.progress.pending) + r.progress.inflight
}

// FirstToken moves a request's booking from prefill to decode. If the
// store cannot be reached within StoreTimeout the report is queued and
// ErrQueued returned.
func (r *Router) FirstToken(ctx context.Context, requestID string) (bool, error) {
	return r.report(ctx, report{kind: reportFirstToken, id: requestID, at: r.now()})
}

// Release ends a request's booking, or queues the release as FirstToken
// does.
func (r *Router) Release(ctx context.Context, requestID string) (bool, error) {
	if r.adm != nil {
		r.adm.released(requestID)
	}
	return r.report(ctx, report{kind: reportRelease, id: requestID, at: r.now()})
}

func (r *Router) report(ctx context.Context, rep report) (bool, error) {
	op := "first token"
	if rep.kind == reportRelease {
		op = "release"
	}
	w := r.reportWindow(rep.id)
	if r.isDown(w) {
		r.progress.push(rep)
		return false, fmt.Errorf("router: %s: %w", op, ErrQueued)
	}
	found, err := r.send(ctx, rep)
	switch {
	case err == nil:
		return found, nil
	case errors.Is(err, kvroute.ErrUnavailable):
		r.markDown(w)
		r.progress.push(rep)
		return false, fmt.Errorf("router: %s: %w", op, ErrQueued)
	}
	return false, fmt.Errorf("router: %s: %w", op, err)
}

// send delivers one report within StoreTimeout.
func (r *Router) send(ctx context.Context, rep report) (bool, error) {
	ctx, cancel := r.storeCtx(ctx)
	defer cancel()
	if rep.kind == reportRelease {
		return r.idx.Release(ctx, rep.id)
	}
	return r.idx.Advance(ctx, rep.id)
}

// Run retries queued progress reports until ctx is done, and under
// admission runs this pod's part of the queue (queue.go). It is one of the
// serving process's tasks; without it queued reports wait (and their
// leases expire on their own).
func (r *Router) Run(ctx context.Context) error {
	if r.adm != nil {
		done := make(chan struct{})
		defer func() { <-done }()
		go func() {
			defer close(done)
			_ = r.adm.run(ctx)
		}()
	}
	retry := time.NewTimer(r.cfg.StoreBackoff)
	defer retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-retry.C:
		case <-r.progress.wake:
		}
		retry.Reset(r.retryQueued(ctx))
	}
}

// retryFloor is the shortest wait between two retry passes, so that a
// window closing as a pass ends does not spin the loop.
const retryFloor = 10 * time.Millisecond

// retryQueued sends every queued report whose domain is up and returns
// how long to wait before the next pass: until the earliest window of a
// report left queued closes, at most StoreBackoff (nothing queued: an
// idle pass, in case a signal was missed).
func (r *Router) retryQueued(ctx context.Context) time.Duration {
	reps := r.progress.take()
	horizon := r.now().Add(-r.maxLease())
	var back []report
	// The windows of what goes back, read when the pass ends (a failed
	// send during it extends its window): the next pass comes as the
	// first of them closes. Domains are few.
	held := map[*atomic.Int64]bool{}
	for _, rep := range reps {
		if rep.at.Before(horizon) {
			r.progress.settle(1)
			continue // the lease has expired by now
		}
		// A report whose domain is still down goes back, in order,
		// unsent; the others go on: one shard's outage must not hold up
		// the reports of models on the shards that answer.
		w := r.reportWindow(rep.id)
		if r.isDown(w) {
			back, held[w] = append(back, rep), true
			continue
		}
		if _, err := r.send(ctx, rep); errors.Is(err, kvroute.ErrUnavailable) {
			r.markDown(w)
			back, held[w] = append(back, rep), true
			continue
		} else if err != nil && ctx.Err() == nil {
			r.log.Warn("progress report failed", "request_id", rep.id, "err", err)
		}
		r.progress.settle(1)
	}
	// Requeued before they stop counting as in flight, so that Queued
	// never says they have landed.
	r.progress.requeue(back)
	r.progress.settle(len(back))
	return r.nextRetry(held)
}

// nextRetry is how long until the first of windows closes, within
// [retryFloor, StoreBackoff]. Reports queued during the pass woke Run
// already (push), and wait for a pass of their own.
func (r *Router) nextRetry(windows map[*atomic.Int64]bool) time.Duration {
	next := r.cfg.StoreBackoff
	now := r.now().UnixNano()
	for w := range windows {
		next = min(next, time.Duration(w.Load()-now))
	}
	return max(next, min(retryFloor, r.cfg.StoreBackoff))
}

func (r *Router) maxLease() time.Duration {
	if r.cfg.MaxLease > 0 {
		return r.cfg.MaxLease
	}
	return MaxLease
}

// storeCtx bounds one store call by StoreTimeout, well inside a
// request's own deadline, so that a hung store turns decisions degraded
// instead of stalling them.
func (r *Router) storeCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.cfg.StoreTimeout)
}
