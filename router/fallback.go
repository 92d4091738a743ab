package router

import (
	"context"
	"time"

	"github.com/kvroute/kvroute"
)

// When the store cannot be reached, the shared queue cannot be either:
// decisions go degraded (round-robin over the last fleet known), and
// admission falls back to a limit per pod, this pod's share of the last
// capacity it knew: the model's fleet capacity (the sum of its replicas'
// request limits, or its fleet max when lower) divided by the pods the
// queue last counted (its subscribers). A model with no request limit has
// no fallback limit either. A request refused by it is shed with
// kvroute.ShedPodLimit; none waits, so none is held past its TTL while
// the store is away, and nothing it admits is booked in the store, so
// nothing is left there to leak when the store returns.

// Pods is what the fallback asks the queue: how many pods share it.
type Pods interface {
	// Pods counts the serving pods subscribed to the queue's grants.
	Pods(ctx context.Context) (int, error)
}

// fallbackLimit is this pod's share of model's last known capacity (0:
// none).
func (a *admitter) fallbackLimit(model string) int64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	c, ok := a.capacity[model]
	if !ok || c <= 0 {
		return 0
	}
	return max(c/int64(max(a.pods, 1)), 1)
}

// fallback admits a degraded decision d (request req) within this pod's
// share, or sheds it.
func (a *admitter) fallback(req Request, d Decision) error {
	limit := a.fallbackLimit(req.Model)
	now := a.now()
	a.mu.Lock()
	held := a.local[req.Model]
	for id, exp := range held {
		if !exp.After(now) {
			delete(held, id)
		}
	}
	if limit > 0 && int64(len(held)) >= limit {
		a.mu.Unlock()
		return a.shed(req, kvroute.ShedPodLimit, 0)
	}
	if held == nil {
		held = map[string]time.Time{}
		a.local[req.Model] = held
	}
	exp := d.Expires
	if exp.IsZero() {
		exp = now.Add(admitFallbackLease)
	}
	held[d.RequestID] = exp
	a.mu.Unlock()
	return nil
}

// admitFallbackLease is how long a degraded admission counts against the
// pod's share when its release never comes.
const admitFallbackLease = 30 * time.Second

// released forgets a degraded admission.
func (a *admitter) released(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, held := range a.local {
		delete(held, id)
	}
}

// noteCapacity remembers model's fleet capacity for the fallback: the sum
// of the replicas' request limits (0 when one has none), bounded by the
// fleet's max.
func (a *admitter) noteCapacity(model string, c kvroute.Capacity) {
	var sum int64
	for _, l := range c.Replicas {
		if l.MaxRequests <= 0 {
			sum = -1
			break
		}
		sum += l.MaxRequests
	}
	if c.MaxInFlight > 0 && (sum < 0 || c.MaxInFlight < sum) {
		sum = c.MaxInFlight
	}
	a.mu.Lock()
	a.capacity[model] = sum
	a.mu.Unlock()
}

// countPods refreshes the pods the queue is shared by, when the queue can
// count them.
func (a *admitter) countPods(ctx context.Context) {
	p, ok := a.q.(Pods)
	if !ok {
		return
	}
	if n, err := p.Pods(ctx); err == nil && n > 0 {
		a.mu.Lock()
		a.pods = n
		a.mu.Unlock()
	}
}
