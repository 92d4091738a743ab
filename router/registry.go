package router

// The registry as a decision sees it: this pod's cached copy (at most
// RegistryTTL old, the last one while the store is down), and the fleet of
// one model taken from it.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
)

// modelFleet is the replicas of replicas that serve model.
func modelFleet(replicas []kvroute.Replica, model string) []kvroute.Replica {
	var fleet []kvroute.Replica
	for _, rep := range replicas {
		if rep.Model == model {
			fleet = append(fleet, rep)
		}
	}
	return fleet
}

// Fleet is the routable replicas of model, from the registry as this pod
// last read it (at most RegistryTTL old, or the last copy while the store
// is unreachable): what a component that must reach one of the model's
// replicas, such as the remote tokenizer, asks without a store round trip.
func (r *Router) Fleet(ctx context.Context, model string) ([]kvroute.Replica, error) {
	replicas, _, err := r.replicas(ctx, model)
	if err != nil {
		return nil, err
	}
	var out []kvroute.Replica
	for _, rep := range replicas {
		if rep.Model == model && rep.Routable() {
			out = append(out, rep)
		}
	}
	return out, nil
}

// Invalidate drops the cached registry, after a write through this pod.
func (r *Router) Invalidate() { r.cached.invalidate() }

// registryCache keeps the last registry read. It is what lets a pod keep
// deciding while the store is down.
type registryCache struct {
	mu       sync.Mutex
	replicas []kvroute.Replica
	at       time.Time
	valid    bool
}

func (c *registryCache) invalidate() {
	c.mu.Lock()
	c.at = time.Time{}
	c.mu.Unlock()
}

// How replicas came by the fleet it returns.
type fleetSource int

// replicas returns the registry, re-read when older than RegistryTTL
// unless a window (the registry's, or model's when model is not empty)
// says the store would fail; the last known copy then stands in.
func (r *Router) replicas(ctx context.Context, model string) (_ []kvroute.Replica, _ fleetSource, _ error) {
	c := &r.cached
	c.mu.Lock()
	if c.valid && model != "" && r.isDown(r.modelWindow(model)) {
		defer c.mu.Unlock()
		return c.replicas, fleetSkipped, nil
	}
	if c.valid && r.now().Sub(c.at) < r.cfg.RegistryTTL {
		defer c.mu.Unlock()
		return c.replicas, fleetRead, nil
	}
	if c.valid && r.isDown(r.globalWindow()) {
		defer c.mu.Unlock()
		return c.replicas, fleetCached, nil
	}
	c.mu.Unlock()
	sctx, cancel := r.storeCtx(ctx)
	list, err := r.reg.ListReplicas(sctx)
	cancel()
	c.mu.Lock()
	defer c.mu.Unlock()
	if err != nil {
		if errors.Is(err, kvroute.ErrUnavailable) {
			r.markDown(r.globalWindow())
			if c.valid {
				return c.replicas, fleetFailed, nil
			}
		}
		return nil, fleetFailed, fmt.Errorf("router: list replicas: %w", err)
	}
	c.replicas, c.at, c.valid = list, r.now(), true
	r.reset.remember(list)
	return list, fleetRead, nil
}
