package router

import (
	"context"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
)

// A store that lost its data (Redis restarted without persistence, a
// failover to an empty replica, FLUSHALL) comes back with an empty
// registry, and an empty registry that suddenly appears must not be taken
// for the truth: every decision would answer 404 for models that had
// replicas a second ago, and nothing would fire an alert. The store keeps
// an epoch (a random id written by the first process that meets it); a
// router that sees it change knows the data is gone and re-seeds the
// registry from its last copy (Options.OnStoreReset), which writes each
// replica unfollowed. Until a registry read lists every replica of that
// copy again, every decision is marked degraded (a model missing from the
// registry goes to the copy); from then on a model's decisions are marked
// degraded until every routable replica of it that publishes events is
// followed again, which an ingestor records once it has rebuilt the
// replica's entries from its replay buffer. A degraded rate then measures
// the loss no longer than it lasts; ResetWindow bounds it.

// Epocher is a registry that can say whether its data was lost
// (*store.Store is one, checked in internal/app). The router finds it by
// type assertion on the Registry, so a registry without it is never
// checked: the named interface and its compile-time check keep a renamed
// method from silently turning reset detection off.
type Epocher interface {
	// Epoch returns the store's epoch: a random id written by the first
	// process to meet the store, which changes only when its data is lost.
	Epoch(ctx context.Context) (string, error)
}

// ResetWindow bounds how long after a store reset decisions fall back to
// the pod's last copy of the registry and say they are degraded, when the
// registry does not list that copy again sooner (nobody re-seeds it, or a
// replica was deleted meanwhile): a window that could not end would keep
// a model an operator deleted answering over its old fleet.
const ResetWindow = 15 * time.Second

// resetState is what the router remembers to survive a reset.
type resetState struct {
	mu    sync.Mutex
	epoch string
	// known is the last non-empty registry read: what a reset re-seeds.
	known []kvroute.Replica
	// missing holds the ids of known, as it was when the reset was
	// detected, that no registry read has listed since: while it is not
	// empty, every decision is made during the reset.
	missing map[string]bool
	// until is ResetWindow after the reset was detected: no decision is
	// made during the reset from then on.
	until time.Time
}

// remember keeps list, a registry read, as the copy a reset re-seeds, and
// notes when a read lists every replica the reset found.
// While the window is open the copy is kept as it was: a read of a
// registry still being re-seeded lists part of it.
func (s *resetState) remember(list []kvroute.Replica) {
	if len(list) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.missing) > 0 {
		listed := make(map[string]bool, len(list))
		for _, rep := range list {
			listed[rep.ID] = true
		}
		for id := range s.missing {
			if !listed[id] {
				return
			}
		}
		s.missing = nil
	}
	s.known = list
}

// knownFleet is model's replicas in the last non-empty registry read.
func (s *resetState) knownFleet(model string) []kvroute.Replica {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []kvroute.Replica
	for _, rep := range s.known {
		if rep.Model == model {
			out = append(out, rep)
		}
	}
	return out
}

// resetting reports whether decisions over fleet (one model's replicas
// as the registry lists them; nil for a model it does not list) are made
// while the store rebuilds after a reset: less than ResetWindow after one
// was detected, while the registry does not list every replica it had
// yet or does not list the model, or while one of fleet's routable replicas that publishes events
// has not been followed again since (its index is still being rebuilt
// from its replay buffer, and what the decision saw of the fleet's cache
// may be short, whichever replica it chose).
func (r *Router) resetting(fleet []kvroute.Replica) bool {
	s := &r.reset
	s.mu.Lock()
	defer s.mu.Unlock()
	if !r.now().Before(s.until) {
		return false
	}
	// A model the registry does not list at all, inside the window, is
	// taken for one a read that raced the re-seed missed (its empty
	// answer may even be the cached copy): the last copy is routed, as
	// before the re-seed, rather than answered 404.
	if len(s.missing) > 0 || fleet == nil {
		return true
	}
	for _, rep := range fleet {
		if rep.Events != "" && rep.Routable() && rep.FollowedSince.IsZero() {
			return true
		}
	}
	return false
}

// reseeded reports whether a registry read listed every replica the last
// reset found since it was detected.
func (s *resetState) reseeded() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.missing) == 0
}

// CheckEpoch reads the store's epoch and, when it changed since the last
// read, handles the reset: the window opens, the registry cache is
// dropped, OnStoreReset is called with the last copy of the registry, and
// the registry is read again, which closes the window when it lists that
// copy. It reports whether a reset was detected. The serving process
// calls it about once a second; Route calls it when a model it knew has
// vanished.
func (r *Router) CheckEpoch(ctx context.Context) (bool, error) {
	ep, ok := r.reg.(Epocher)
	if !ok {
		return false, nil
	}
	sctx, cancel := r.storeCtx(ctx)
	epoch, err := ep.Epoch(sctx)
	cancel()
	if err != nil {
		return false, err
	}
	s := &r.reset
	s.mu.Lock()
	prev := s.epoch
	s.epoch = epoch
	changed := prev != "" && prev != epoch
	var known []kvroute.Replica
	if changed && len(s.known) > 0 {
		s.until = r.now().Add(ResetWindow)
		known = append(known, s.known...)
		s.missing = make(map[string]bool, len(known))
		for _, rep := range known {
			s.missing[rep.ID] = true
		}
	}
	s.mu.Unlock()
	if !changed {
		return false, nil
	}
	r.log.Warn("the state store lost its data (its epoch changed): re-seeding the registry from this pod's last copy; decisions are degraded while the index rebuilds",
		"replicas", len(known), "window", ResetWindow)
	r.Invalidate()
	if r.onReset != nil && len(known) > 0 {
		r.onReset(ctx, known)
		// The re-seeded registry, read now, lists the replicas again;
		// decisions stay degraded, model by model, until an ingestor has
		// rebuilt and marked followed each replica of the model.
		r.Invalidate()
		if _, _, err := r.replicas(ctx, ""); err != nil {
			r.log.Debug("registry read after the re-seed", "err", err)
		}
		if r.reset.reseeded() {
			r.log.Info("registry re-seeded: decisions stay degraded until the ingestors have rebuilt each replica of their model", "replicas", len(known))
		} else {
			r.log.Warn("the re-seeded registry does not list this pod's whole copy yet: decisions stay degraded until it does", "window", ResetWindow)
		}
	}
	return true, nil
}

// RunEpochCheck checks the store's epoch every interval until ctx is
// done: one of the serving process's tasks.
func (r *Router) RunEpochCheck(ctx context.Context, interval time.Duration) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if _, err := r.CheckEpoch(ctx); err != nil && ctx.Err() == nil {
			r.log.Debug("epoch check", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}
