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
// router that sees it change knows the data is gone, re-seeds the
// registry from its last copy (Options.OnStoreReset) and, for ResetWindow,
// decides over that copy and marks its decisions degraded while the
// ingestors rebuild the index from the replicas' replay buffers.

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

// ResetWindow is how long after a store reset decisions fall back to the
// pod's last copy of the registry and say the index is rebuilding.
const ResetWindow = 15 * time.Second

// resetState is what the router remembers to survive a reset.
type resetState struct {
	mu    sync.Mutex
	epoch string
	// known is the last non-empty registry read: what a reset re-seeds.
	known []kvroute.Replica
	until time.Time
}

func (s *resetState) remember(list []kvroute.Replica) {
	if len(list) == 0 {
		return
	}
	s.mu.Lock()
	s.known = list
	s.mu.Unlock()
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

// resetting reports whether a reset was detected less than ResetWindow ago.
func (r *Router) resetting() bool {
	r.reset.mu.Lock()
	defer r.reset.mu.Unlock()
	return r.now().Before(r.reset.until)
}

// CheckEpoch reads the store's epoch and, when it changed since the last
// read, handles the reset: the window starts, the registry cache is
// dropped, and OnStoreReset is called with the last copy of the registry.
// It reports whether a reset was detected. The serving process calls it
// about once a second; Route calls it when a model it knew has vanished.
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
	if changed {
		s.until = r.now().Add(ResetWindow)
		known = append(known, s.known...)
	}
	s.mu.Unlock()
	if !changed {
		return false, nil
	}
	r.log.Warn("the state store lost its data (its epoch changed): re-seeding the registry from this pod's last copy; decisions are degraded while the index rebuilds",
		"replicas", len(known), "window", ResetWindow)
	r.Invalidate()
	if r.onReset != nil {
		r.onReset(ctx, known)
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
