package tests_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/store"
)

// startAdmitPod is a serving pod with admission on under cfg.
func startAdmitPod(t *testing.T, redisURL, name string, cfg admission.Config) *pod {
	t.Helper()
	return startPodWith(t, redisURL, func(c *app.Config) { c.Router.Admission, c.Pod = cfg, name })
}

// openTestStore is a store client of the test's own on redisURL.
func openTestStore(t *testing.T, redisURL string) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), redisURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}

func putReplicas(t *testing.T, st *store.Store, model string, n int) {
	t.Helper()
	for i := range n {
		rep := kvroute.Replica{ID: fmt.Sprintf("%s-r%d", model, i), Model: model, URL: "http://127.0.0.1:1"}
		if err := st.PutReplica(context.Background(), rep); err != nil {
			t.Fatal(err)
		}
	}
}

// TestAdmissionAcrossPods: two pods over one real redis-server share one
// queue. With two replicas that take one request each, a third request
// waits; a release on the other pod admits it; a request that may not
// wait is shed with its position; the queue ends empty with no booking
// left.
func TestAdmissionAcrossPods(t *testing.T) {
	rp := startRedisProc(t)
	cfg := admission.Config{Enabled: true, Limits: kvroute.Limits{MaxRequests: 1}}
	a, b := startAdmitPod(t, rp.url(), "pod-a", cfg), startAdmitPod(t, rp.url(), "pod-b", cfg)
	st := openTestStore(t, rp.url())
	const model = "adm"
	putReplicas(t, st, model, 2)
	ctx := context.Background()
	req := func(i int) router.Request {
		return router.Request{Model: model, Tokens: seqTokens(i*1000, 64), MaxTokens: 8, MaxWait: -1}
	}
	d1, err := a.a.Router.Route(ctx, req(1))
	if err != nil {
		t.Fatal(err)
	}
	d2, err := b.a.Router.Route(ctx, req(2))
	if err != nil {
		t.Fatal(err)
	}
	if d1.Replica.ID == d2.Replica.ID {
		t.Fatalf("two requests on %s, want one on each replica", d1.Replica.ID)
	}
	t.Run("a request that may not wait is shed with its position", func(t *testing.T) {
		r := req(3)
		r.MaxWait = 0
		_, err := b.a.Router.Route(ctx, r)
		var se *router.ShedError
		if !errors.As(err, &se) || se.Reason != kvroute.ShedNoWait || se.RetryAfter < time.Second {
			t.Fatalf("err = %v, want a no_wait shed with a Retry-After", err)
		}
	})
	t.Run("a release on one pod admits the request another holds", func(t *testing.T) {
		type result struct {
			d   router.Decision
			err error
		}
		done := make(chan result, 1)
		go func() {
			d, err := b.a.Router.Route(ctx, req(4))
			done <- result{d, err}
		}()
		wait.Until(t, "the request queued", func() bool {
			n, _ := st.QueueDepth(ctx, model)
			return n == 1
		})
		if ok, err := a.a.Router.Release(ctx, d1.RequestID); !ok || err != nil {
			t.Fatalf("release = %v, %v", ok, err)
		}
		got := wait.Recv(t, "the queued decision", done)
		if got.err != nil || got.d.Replica.ID != d1.Replica.ID || got.d.Queued <= 0 {
			t.Fatalf("queued decision = %+v, %v; want it on %s after a wait", got.d.Replica.ID, got.err, d1.Replica.ID)
		}
		for _, id := range []string{d2.RequestID, got.d.RequestID} {
			if ok, err := a.a.Router.Release(ctx, id); !ok || err != nil {
				t.Fatalf("release %s = %v, %v", id, ok, err)
			}
		}
	})
	t.Run("a client that leaves leaves the queue", func(t *testing.T) {
		fill := make([]router.Decision, 2)
		for i := range fill {
			if fill[i], err = a.a.Router.Route(ctx, req(10+i)); err != nil {
				t.Fatal(err)
			}
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			_, err := b.a.Router.Route(cctx, req(20))
			done <- err
		}()
		wait.Until(t, "the request queued", func() bool {
			n, _ := st.QueueDepth(ctx, model)
			return n == 1
		})
		cancel()
		if err := wait.Recv(t, "the cancelled decision", done); !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want context.Canceled", err)
		}
		if n, _ := st.QueueDepth(ctx, model); n != 0 {
			t.Errorf("depth after the client left = %d, want 0", n)
		}
		for _, d := range fill {
			if ok, _ := a.a.Router.Release(ctx, d.RequestID); !ok {
				t.Fatalf("release %s = false", d.RequestID)
			}
		}
	})
	loads, err := st.Loads(ctx, model, []string{model + "-r0", model + "-r1"})
	if err != nil {
		t.Fatal(err)
	}
	for i, l := range loads {
		if l.Requests != 0 || l.PrefillBlocks != 0 || l.DecodeBlocks != 0 {
			t.Errorf("replica %d's load after everything was released = %+v, want none", i, l)
		}
	}
}

// TestAdmissionFleetLimit: many concurrent requests over two pods never
// put more than the fleet's max in flight, and every one ends admitted.
func TestAdmissionFleetLimit(t *testing.T) {
	rp := startRedisProc(t)
	cfg := admission.Config{Enabled: true, MaxInFlight: 3}
	pods := []*pod{startAdmitPod(t, rp.url(), "pod-a", cfg), startAdmitPod(t, rp.url(), "pod-b", cfg)}
	st := openTestStore(t, rp.url())
	const model = "fleet"
	putReplicas(t, st, model, 4)
	ids := []string{model + "-r0", model + "-r1", model + "-r2", model + "-r3"}
	ctx := context.Background()
	var mu sync.Mutex
	peak := 0
	var wg sync.WaitGroup
	const n = 40
	errs := make(chan error, n)
	for i := range n {
		wg.Go(func() {
			p := pods[i%2]
			d, err := p.a.Router.Route(ctx, router.Request{Model: model, Tokens: seqTokens(i, 32), MaxTokens: 4, MaxWait: -1})
			if err != nil {
				errs <- err
				return
			}
			loads, err := st.Loads(ctx, model, ids)
			if err == nil {
				total := 0
				for _, l := range loads {
					total += int(l.Requests)
				}
				mu.Lock()
				peak = max(peak, total)
				mu.Unlock()
			}
			if _, err := p.a.Router.Release(ctx, d.RequestID); err != nil {
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("decision: %v", err)
	}
	if peak > 3 {
		t.Errorf("peak in flight = %d, want at most the fleet's max, 3", peak)
	}
	if n, _ := st.QueueDepth(ctx, model); n != 0 {
		t.Errorf("depth after the run = %d, want 0", n)
	}
}

// TestAdmissionColdStart: a declared model with no replica holds its
// requests; a replica registered later serves every one of them.
func TestAdmissionColdStart(t *testing.T) {
	rp := startRedisProc(t)
	const model = "cold"
	cfg := admission.Config{Enabled: true, Models: map[string]admission.Model{model: {}}}
	p := startAdmitPod(t, rp.url(), "pod-a", cfg)
	st := openTestStore(t, rp.url())
	ctx := context.Background()
	const n = 20
	done := make(chan error, n)
	for i := range n {
		go func() {
			d, err := p.a.Router.Route(ctx, router.Request{Model: model, Tokens: seqTokens(i, 32), MaxTokens: 4, MaxWait: -1})
			if err == nil && d.Replica.ID != model+"-r0" {
				err = fmt.Errorf("routed to %q", d.Replica.ID)
			}
			done <- err
		}()
	}
	wait.Until(t, "every request queued", func() bool {
		d, _ := st.QueueDepth(ctx, model)
		return d == n
	})
	putReplicas(t, st, model, 1)
	for range n {
		if err := wait.Recv(t, "a decision", done); err != nil {
			t.Errorf("decision: %v", err)
		}
	}
}

// TestAdmissionStoreDown: with the store gone the queue is too; decisions
// go degraded within this pod's share of the last capacity it knew (two
// replicas of one request each, one pod: two), the rest are shed at once
// with pod_limit, none waits, and once the store is back a release
// frees the share.
func TestAdmissionStoreDown(t *testing.T) {
	rp := startRedisProc(t)
	cfg := admission.Config{Enabled: true, Limits: kvroute.Limits{MaxRequests: 1}}
	p := startAdmitPod(t, rp.url(), "pod-a", cfg)
	st := openTestStore(t, rp.url())
	const model = "down"
	putReplicas(t, st, model, 2)
	ctx := context.Background()
	req := router.Request{Model: model, Tokens: seqTokens(5, 32), MaxTokens: 4, MaxWait: -1}
	// One decision with the store up: the pod learns the capacity.
	d, err := p.a.Router.Route(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := p.a.Router.Release(ctx, d.RequestID); err != nil {
		t.Fatal(err)
	}
	rp.kill(syscall.SIGKILL)
	var ids []string
	for i := range 2 {
		d, err := p.a.Router.Route(ctx, req)
		if err != nil || !d.Degraded {
			t.Fatalf("degraded decision %d = %+v, %v; want admitted, degraded", i, d.Degraded, err)
		}
		ids = append(ids, d.RequestID)
	}
	_, err = p.a.Router.Route(ctx, req)
	var se *router.ShedError
	if !errors.As(err, &se) || se.Reason != kvroute.ShedPodLimit {
		t.Fatalf("third decision with the store down: err = %v, want a pod_limit shed", err)
	}
	_, _ = p.a.Router.Release(ctx, ids[0])
	if d, err := p.a.Router.Route(ctx, req); err != nil || !d.Degraded {
		t.Fatalf("decision after a release = %+v, %v; want admitted", d.Degraded, err)
	}
}
