package router

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
)

// This pod's side of the shared queue: the requests it holds that wait
// (each told of its seat on a channel, by the grants the store publishes
// to this pod), and one beat per pod, not per request, that renews their
// hold, lets the store dispatch what capacity appeared without a release
// (a replica registered, a scrape, a limit raised) and recovers a grant
// whose message was lost.

// Admission timings. A pod that dies takes its tickets out of the queue
// within admitHold, and the seats granted to them are given back within
// admitGrant after that (the sweep, or any pod's beat): a bound of
// admitHold + admitGrant + the ingestors' sweep interval, at worst.
const (
	admitHold  = 5 * time.Second
	admitGrant = 2 * time.Second
	admitBeat  = 250 * time.Millisecond
	// idleKickEvery is how many beats pass between kicks of the models
	// this pod holds no waiters for (a second), and idleKickFor how long
	// after it last described a model it keeps kicking it.
	idleKickEvery = 4
	idleKickFor   = time.Minute
	// describeEvery is how often a model's description is rebuilt from
	// the decisions' view (the registry's cache life).
	describeEvery = 250 * time.Millisecond
	// capRefresh rewrites a model's capacity this often even unchanged,
	// so that a store that lost it (a restart, a flush) has it again.
	capRefresh = 10 * time.Second
)

// admitter is this pod's part of admission.
type admitter struct {
	q   Queue
	cfg admission.Config
	pod string
	log *slog.Logger
	now func() time.Time
	m   *admitMetrics

	mu      sync.Mutex
	waiters map[string]*waiter
	caps    map[string]capSeen
	// known are the models this pod has seen served: a request for one
	// whose replicas are all gone waits out the cold start, as one for a
	// model Config.Models names does.
	known map[string]bool
	wake  chan struct{}
	// capacity and pods are the fallback's (fallback.go): each model's
	// last known fleet capacity, and the pods sharing the queue; local
	// the degraded admissions this pod holds, by model.
	capacity map[string]int64
	pods     int
	local    map[string]map[string]time.Time
	lastPods time.Time
	beats    int
	// refresh describes a model's capacity from a fresh registry read
	// (Router.describeModel), so that replicas that came up are seen.
	refresh func(ctx context.Context, model string)
}

// waiter is one queued request this pod holds.
type waiter struct {
	model          string
	priority       int
	tenant         string
	seat           chan string
	since          time.Time
	dispatchedFrom time.Time
}

// capSeen is the last description of a model this pod built (at) and
// wrote (written), of n candidates.
type capSeen struct {
	sig         string
	at, written time.Time
	n           int
}

func newAdmitter(q Queue, cfg admission.Config, pod string, log *slog.Logger, now func() time.Time, m *admitMetrics) *admitter {
	return &admitter{q: q, cfg: cfg, pod: pod, log: log, now: now, m: m,
		waiters: map[string]*waiter{}, caps: map[string]capSeen{}, known: map[string]bool{}, wake: make(chan struct{}, 1),
		capacity: map[string]int64{}, local: map[string]map[string]time.Time{}}
}

// describe tells the store model's capacity when this pod's view of it
// changed, or capRefresh after it last did.
func (a *admitter) describe(ctx context.Context, r *Router, model string, bs int, cands candidates, lims []kvroute.Limits) {
	// A pod's view changes at most once a registry read: between them
	// the description is not rebuilt (it would cost every decision a map
	// and a signature).
	now := a.now()
	a.mu.Lock()
	seen := a.caps[model]
	a.mu.Unlock()
	if seen.n == len(cands.fleet) && now.Sub(seen.at) < describeEvery && seen.sig != "" {
		return
	}
	c := kvroute.Capacity{Replicas: map[string]kvroute.Limits{}, BlockSize: bs, MaxInFlight: a.cfg.MaxInFlightFor(model),
		StaleAfter: a.cfg.StaleAge(), StaleSaturated: a.cfg.StaleSaturated, GrantTTL: admitGrant}
	for i, rep := range cands.fleet {
		if rep.Routable() {
			c.Replicas[rep.ID] = lims[i]
		}
	}
	a.noteCapacity(model, c)
	var b strings.Builder
	fmt.Fprintf(&b, "%d,%d,%v,%v;", c.BlockSize, c.MaxInFlight, c.StaleAfter, c.StaleSaturated)
	for _, id := range slices.Sorted(maps.Keys(c.Replicas)) {
		fmt.Fprintf(&b, "%s=%+v;", id, c.Replicas[id])
	}
	a.mu.Lock()
	if len(c.Replicas) > 0 {
		a.known[model] = true
	}
	if seen.sig == b.String() && now.Sub(seen.written) < capRefresh {
		a.caps[model] = capSeen{sig: seen.sig, at: now, written: seen.written, n: len(cands.fleet)}
		a.mu.Unlock()
		return
	}
	a.mu.Unlock()
	sctx, cancel := r.storeCtx(ctx)
	err := a.q.SetCapacity(sctx, model, c)
	cancel()
	if err != nil {
		a.log.Debug("describe capacity", "model", model, "err", err)
		return
	}
	a.mu.Lock()
	a.caps[model] = capSeen{sig: b.String(), at: now, written: now, n: len(cands.fleet)}
	a.mu.Unlock()
}

// mayColdStart reports whether a request for model, which has no
// replica up, waits for one.
func (a *admitter) mayColdStart(model string) bool {
	if a.cfg.ColdStartWait() <= 0 {
		return false
	}
	if _, ok := a.cfg.Models[model]; ok {
		return true
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.known[model]
}

// budget is how long a request may wait: its own bound, within the
// queue's TTL, or the cold-start wait for a model with no replica.
func (a *admitter) budget(req Request, cold bool) time.Duration {
	limit := a.cfg.TTLOrDefault()
	if cold {
		limit = a.cfg.ColdStartWait()
	}
	if req.MaxWait < 0 || req.MaxWait > limit {
		return limit
	}
	return req.MaxWait
}

// wait queues the request (id, its charge cost) and returns the replica
// of the seat it is granted, or a *ShedError, or the context's error when
// the client left. cold says the model has no replica up.
func (a *admitter) wait(ctx context.Context, r *Router, req Request, id string, cost int64, cold bool) (string, error) {
	budget := a.budget(req, cold)
	w := &waiter{model: req.Model, priority: req.Priority, tenant: req.Tenant, seat: make(chan string, 1), since: a.now()}
	a.mu.Lock()
	a.waiters[id] = w
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		delete(a.waiters, id)
		a.mu.Unlock()
	}()
	t := kvroute.Ticket{RequestID: id, Model: req.Model, Pod: a.pod, Priority: req.Priority, Tenant: req.Tenant, Cost: cost,
		Deadline: a.now().Add(budget)}
	lim := kvroute.QueueLimits{Queue: a.cfg.QueueMax(), Band: a.cfg.BandMax(), Tenant: a.cfg.TenantMax(), FairShare: a.cfg.FairShare()}
	// A client that leaves mid-call must not lose the ticket's answer:
	// the enqueue runs to its end (bounded by the store timeout), and a
	// failed one is taken back, in case Redis ran it.
	sctx, cancel := r.storeCtx(context.WithoutCancel(ctx))
	ad, err := a.q.Enqueue(sctx, t, admitHold, lim)
	cancel()
	if err != nil {
		a.leave(ctx, r, id)
		return "", fmt.Errorf("router: enqueue: %w", err)
	}
	if ctx.Err() != nil {
		a.leave(ctx, r, id)
		a.m.gone(req)
		return "", ctx.Err()
	}
	switch ad.Status {
	case kvroute.Granted:
		return ad.Replica, nil
	case kvroute.Shed:
		return "", a.shed(req, ad.Reason, ad.Position)
	}
	a.m.queued(req)
	if budget <= 0 {
		a.leave(ctx, r, id)
		return "", a.shed(req, noWaitReason(cold), ad.Position)
	}
	a.poke()
	timer := time.NewTimer(budget)
	defer timer.Stop()
	select {
	case seat := <-w.seat:
		return seat, nil
	case <-timer.C:
		a.leave(ctx, r, id)
		if cold {
			return "", a.shed(req, kvroute.ShedNoReplica, 0)
		}
		return "", a.shed(req, kvroute.ShedTTL, 0)
	case <-ctx.Done():
		a.leave(ctx, r, id)
		a.m.gone(req)
		return "", ctx.Err()
	}
}

func noWaitReason(cold bool) string {
	if cold {
		return kvroute.ShedNoReplica
	}
	return kvroute.ShedNoWait
}

// leave takes id out of the queue, giving back a seat granted to it
// meanwhile; it outlives the caller's context, which may be what ended.
func (a *admitter) leave(ctx context.Context, r *Router, id string) {
	sctx, cancel := r.storeCtx(context.WithoutCancel(ctx))
	defer cancel()
	if _, err := a.q.Dequeue(sctx, id); err != nil {
		// The ticket's hold runs out on its own, and a seat is swept.
		a.log.Debug("leave the queue", "err", err)
	}
}

// shed is the refusal of req, counted.
func (a *admitter) shed(req Request, reason string, position int) error {
	a.m.shed(req, reason)
	return &ShedError{Model: req.Model, Reason: reason, Position: position, RetryAfter: a.retryAfter(req.Model, position)}
}

// retryAfter estimates when a retry of a request shed at position may be
// admitted: the time the requests ahead of it took to be admitted, as the
// pod saw them, at least a second.
func (a *admitter) retryAfter(model string, position int) time.Duration {
	per := a.m.meanWait(model)
	d := time.Duration(float64(per) * float64(max(position, 1)) / float64(max(len(a.caps), 1)))
	return min(max(d, time.Second), time.Minute)
}

// poke wakes the beat, so that a newly queued request is seen soon.
func (a *admitter) poke() {
	select {
	case a.wake <- struct{}{}:
	default:
	}
}

// granted delivers g to the waiter it names, if this pod holds it.
func (a *admitter) granted(g kvroute.Grant) bool {
	a.mu.Lock()
	w, ok := a.waiters[g.RequestID]
	a.mu.Unlock()
	if !ok {
		return false
	}
	select {
	case w.seat <- g.Replica:
		if !g.At.IsZero() {
			a.m.dispatched(w, a.now().Sub(g.At))
		}
	default:
	}
	return true
}

// run receives this pod's grants and beats while it holds waiters, until
// ctx ends. A store that cannot be subscribed to is retried each beat:
// the beat alone still admits, a beat later.
func (a *admitter) run(ctx context.Context) error {
	grants, err := a.q.Grants(ctx, a.pod)
	if err != nil {
		a.log.Warn("admission: subscribe to grants; the beat admits alone until it can", "err", err)
	}
	tick := time.NewTicker(admitBeat)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case g, ok := <-grants:
			if !ok {
				grants = nil
				continue
			}
			a.granted(g)
		case <-a.wake:
			a.beat(ctx)
		case <-tick.C:
			if grants == nil {
				if grants, err = a.q.Grants(ctx, a.pod); err != nil {
					grants = nil
				}
			}
			a.beat(ctx)
		}
	}
}

// beat kicks every model this pod holds waiters for and, every
// idleKickEvery beats, every other model it described lately: the tickets
// and seats of a pod that died are given back by any live pod's beat,
// whether or not it has waiters of its own, and whether or not an
// ingestor sweeps. Now and then it counts the pods sharing the queue.
func (a *admitter) beat(ctx context.Context) {
	a.beats++
	if now := a.now(); now.Sub(a.lastPods) > capRefresh/2 {
		a.lastPods = now
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		a.countPods(pctx)
		cancel()
	}
	a.mu.Lock()
	byModel := map[string][]string{}
	for id, w := range a.waiters {
		byModel[w.model] = append(byModel[w.model], id)
	}
	if a.beats%idleKickEvery == 0 {
		for model, seen := range a.caps {
			if _, ok := byModel[model]; !ok && a.now().Sub(seen.at) < idleKickFor {
				byModel[model] = nil
			}
		}
	}
	a.mu.Unlock()
	for model, ids := range byModel {
		kctx, cancel := context.WithTimeout(ctx, time.Second)
		if a.refresh != nil && len(ids) > 0 {
			a.refresh(kctx, model)
		}
		depth, states, err := a.q.Kick(kctx, model, admitHold, ids)
		cancel()
		if err != nil {
			if !errors.Is(err, context.Canceled) {
				a.log.Debug("admission beat", "model", model, "err", err)
			}
			continue
		}
		a.m.depth(model, depth)
		for i, st := range states {
			if st.Replica != "" {
				a.granted(kvroute.Grant{RequestID: ids[i], Replica: st.Replica})
			}
		}
	}
}

// waiting counts this pod's waiters by model, priority and tenant.
func (a *admitter) waiting() map[[3]string]int64 {
	out := map[[3]string]int64{}
	if a == nil {
		return out
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, w := range a.waiters {
		out[[3]string{w.model, strconv.Itoa(w.priority), a.m.tenant(w.tenant)}]++
	}
	return out
}
