package router

import (
	"sync"
	"sync/atomic"
)

// The store's back-off windows. After a store call fails, the calls that
// would meet the same failure skip the store for StoreBackoff: decisions
// are degraded at once instead of each waiting out a connection attempt.
// What "the same failure" covers follows where the data lives. A model's
// index, loads and leases share one hash tag, so under Redis Cluster one
// shard holds them, and a shard that fails takes down only the models it
// holds: each model has its own window, and a decision for a model on a
// healthy shard still goes to the store. The registry (a global key,
// cached for RegistryTTL) has its own: while it is open, decisions use
// the last copy and still look up their model's index, except the model
// whose decision met the registry's failure, whose window opens with it
// (with one Redis its lookup would fail too, and a hung store would make
// that decision wait twice). Progress reports
// (first tokens, releases) name only a request id, so they share one
// window, and a report that meets it is queued for Run to retry.
type backoff struct {
	registry atomic.Int64 // unix nanoseconds until which the registry is skipped
	progress atomic.Int64 // likewise for progress reports
	models   sync.Map     // model -> *atomic.Int64
}

// until is model's window, made on first use.
func (b *backoff) until(model string) *atomic.Int64 {
	if v, ok := b.models.Load(model); ok {
		return v.(*atomic.Int64)
	}
	v, _ := b.models.LoadOrStore(model, new(atomic.Int64))
	return v.(*atomic.Int64)
}

// open reports whether now (unix nanoseconds) is inside any window.
func (b *backoff) open(now int64) bool {
	if now < b.registry.Load() || now < b.progress.Load() {
		return true
	}
	down := false
	b.models.Range(func(_, v any) bool {
		down = now < v.(*atomic.Int64).Load()
		return !down
	})
	return down
}

// markDown opens w for StoreBackoff.
func (r *Router) markDown(w *atomic.Int64) {
	w.Store(r.now().Add(r.cfg.StoreBackoff).UnixNano())
}

// isDown reports whether w is open.
func (r *Router) isDown(w *atomic.Int64) bool { return r.now().UnixNano() < w.Load() }

// modelDown reports whether model's window is open.
func (r *Router) modelDown(model string) bool {
	if model == "" {
		return false
	}
	v, ok := r.down.models.Load(model)
	return ok && r.isDown(v.(*atomic.Int64))
}
