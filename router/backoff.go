package router

import (
	"sync"
	"sync/atomic"
)

// The store's back-off windows. After a store call fails, the calls that
// would meet the same failure skip the store for StoreBackoff: decisions
// are degraded at once, and progress reports queued, instead of each
// waiting out a connection attempt. What "the same failure" covers is the
// store's to say (an Index that is also Domains): one server is one domain,
// so one failure there opens the window for every call, as it should;
// under Redis Cluster a model's keys share one slot, and its domain is
// the primary serving that slot, so a shard that fails takes down only
// the models whose slots it holds, once a window between them; the
// registry's domain is its own key's primary. A model's decision checks its
// model's window; a registry read, the global one (while it is open,
// decisions use the last copy of the registry and still read their
// model's index, which may be up); a progress report, the window of the
// model its request id names (RequestModel).
//
// An index that says nothing (the tests' fakes) gets one domain per
// model and one for the global keys.

// Domains is what an Index may also say about where its data lives. It
// is optional, so a changed signature would silently stop matching: the
// wiring checks the store satisfies it at compile time.
type Domains interface {
	// FailureDomain names the part of the store whose failures model's
	// calls share ("" for the global keys').
	FailureDomain(model string) string
	// RequestModel is the model a request id was minted for.
	RequestModel(id string) (string, bool)
}

// backoff holds one window per domain: domain -> *atomic.Int64, the unix
// nanoseconds until which its calls skip the store. Domains are few (one,
// or a Cluster's primaries).
type backoff struct {
	windows sync.Map
}

// window is the window of domain d, made on first use.
func (b *backoff) window(d string) *atomic.Int64 {
	if v, ok := b.windows.Load(d); ok {
		return v.(*atomic.Int64)
	}
	v, _ := b.windows.LoadOrStore(d, new(atomic.Int64))
	return v.(*atomic.Int64)
}

// open reports whether now (unix nanoseconds) is inside any window.
func (b *backoff) open(now int64) bool {
	down := false
	b.windows.Range(func(_, v any) bool {
		down = now < v.(*atomic.Int64).Load()
		return !down
	})
	return down
}

// domainsOf is idx as Domains, or nil.
func domainsOf(idx Index) Domains {
	d, _ := idx.(Domains)
	return d
}

// domain is the failure domain of model's calls ("" for the registry's).
func (r *Router) domain(model string) string {
	if r.domains != nil {
		return r.domains.FailureDomain(model)
	}
	return "model " + model
}

// modelWindow is the window a decision for model checks and opens.
func (r *Router) modelWindow(model string) *atomic.Int64 { return r.down.window(r.domain(model)) }

// globalWindow is the registry's window.
func (r *Router) globalWindow() *atomic.Int64 { return r.down.window(r.domain("")) }

// reportWindow is the window of a progress report for request id: its
// model's, or the global one for an id that names none.
func (r *Router) reportWindow(id string) *atomic.Int64 {
	model := ""
	if r.domains != nil {
		model, _ = r.domains.RequestModel(id)
	}
	return r.down.window(r.domain(model))
}

// markDown opens w for StoreBackoff.
func (r *Router) markDown(w *atomic.Int64) {
	w.Store(r.now().Add(r.cfg.StoreBackoff).UnixNano())
}

// isDown reports whether w is open.
func (r *Router) isDown(w *atomic.Int64) bool { return r.now().UnixNano() < w.Load() }
