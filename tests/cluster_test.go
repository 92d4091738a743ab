package tests_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/store"
	"github.com/kvroute/kvroute/vllmtest"
)

// TestClusterPrimaryRestart runs decisions for two models whose slots live
// on different primaries of a real 3-primary Redis Cluster, kills the first
// model's primary under traffic (SIGKILL, AOF on) and starts it again
// once the cluster has marked it failed (after its 1 s node timeout; its
// slots answer CLUSTERDOWN meanwhile). See clusterFault for what must hold.
func TestClusterPrimaryRestart(t *testing.T) {
	c := redistest.Cluster(t, 3)
	clusterFault(t, c, faultModel, "started again",
		func(i int) { c.Stop(t, i, syscall.SIGKILL) },
		func(i int) { c.Start(t, i) })
}

// TestClusterPrimaryHung is TestClusterPrimaryRestart with the first
// model's primary frozen (SIGSTOP) until the cluster marks it failed, and
// then continued: its
// sockets accept and nothing answers, so that model's store calls wait
// out their timeout, and nothing else may wait with them (each model has
// its own pipelines and its own back-off window).
func TestClusterPrimaryHung(t *testing.T) {
	c := redistest.Cluster(t, 3)
	clusterFault(t, c, faultModel, "resumed",
		func(i int) { c.Pause(t, i) },
		func(i int) { c.Resume(t, i) })
}

// TestClusterRegistryPrimaryRestart kills the primary that holds the
// registry (and neither model) instead: pods route over their last copy
// of it and keep reading the models' own shards, so only the decisions
// that meet a failed registry read (one a back-off window) are degraded.
func TestClusterRegistryPrimaryRestart(t *testing.T) {
	c := redistest.Cluster(t, 3)
	clusterFault(t, c, faultRegistry, "started again",
		func(i int) { c.Stop(t, i, syscall.SIGKILL) },
		func(i int) { c.Start(t, i) })
}

// TestClusterPrimaryLostData: the primary serving a model's slot restarts
// empty (no persistence, a lost disk) between two of its replica's event
// batches, while the shards holding the registry, the epoch and the
// ingestor's lease keep their data: nothing reads as a reset of the whole
// store, and the ingestor never met an error. The next batch it applies
// finds the replica's applied seq gone; it must rebuild the replica's
// entries from the replay buffer, so that prompts cached before the loss
// are routed cache-aware again, not only the ones after it.
func TestClusterPrimaryLostData(t *testing.T) {
	c := redistest.Cluster(t, 3)
	global := map[int]bool{c.Primary(t, "kvr:replicas"): true, c.Primary(t, "kvr:replicas"): true}
	mdl, id := "", ""
	for i := 0; mdl == "" && i < 256; i++ {
		m := "lost-model-" + strconv.Itoa(i)
		if !global[c.Primary(t, "kvr:{m:"+m+"}:load")] {
			mdl = m
		}
	}
	shard := c.Primary(t, "kvr:{m:"+mdl+"}:load")
	for i := 0; id == "" && i < 256; i++ {
		if r := "r" + strconv.Itoa(i); c.Primary(t, "kvr:own:ingest:"+r) != shard {
			id = r
		}
	}
	if mdl == "" || id == "" {
		t.Fatal("no model and replica whose shard holds none of the global keys")
	}
	h := newClusterHarness(t, c, mdl)
	rep := h.addReplica(id, vllmtest.Config{})
	ing, _ := h.startIngestor("ing", h.openStore())
	h.waitOwned(ing)

	r := rand.New(rand.NewPCG(21, 21))
	var before [][]int
	for range 3 {
		p := prompt(r, nil, 6*bs)
		before = append(before, p)
		if _, err := rep.Admit(p, ""); err != nil {
			t.Fatal(err)
		}
	}
	h.synced(id)
	h.waitTruth(before, false)

	c.Stop(t, shard, syscall.SIGKILL)
	c.Wipe(t, shard)
	c.Start(t, shard)
	c.WaitOK(t, 30*time.Second)
	h.waitFor("the wiped shard answers, without the replica's applied seq", func() bool {
		_, ok, err := h.st.AppliedSeq(h.ctx, mdl, id)
		return err == nil && !ok
	})

	after := prompt(r, nil, 4*bs)
	if _, err := rep.Admit(after, ""); err != nil {
		t.Fatal(err)
	}
	h.synced(id)
	h.waitTruth(append(before, after), false)
	for i, p := range before {
		if d := h.route(p); d.Replica.ID != id || d.Matched != len(p)/bs {
			t.Errorf("prompt %d cached before the loss: routed to %s with %d matched blocks, want %s with %d", i, d.Replica.ID, d.Matched, id, len(p)/bs)
		}
	}
}

// Which primary clusterFault brings down.
const (
	faultModel    = "the first model's primary"
	faultRegistry = "the registry's primary"
)

// clusterFault runs decisions alternating between two models on c, and
// brings one primary down (down) under traffic and back (up) once the
// traffic has met the outage and the cluster has marked the node failed:
// with target faultModel, the first model's primary, which holds neither
// the registry nor the second model; with faultRegistry, the registry's,
// which holds neither model. Every decision is released, as the proxy
// releases them. Every decision must be answered (degraded while its
// store fails) within the request deadline, every store error must be
// kvroute.ErrUnavailable, a model whose primary stays up must stay
// cache-aware throughout (but for the decisions that meet a failed
// registry read), and every model must be cache-aware again by itself
// once the primary is back.
func clusterFault(t *testing.T, c *redistest.RedisCluster, target, upVerb string, down, up func(i int)) {
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	var models []string
	var prims []int
	reg := c.Primary(t, "kvr:replicas")
	for i := 0; len(models) < 2 && i < 256; i++ {
		m := "cluster-model-" + strconv.Itoa(i)
		p := c.Primary(t, "kvr:{m:"+m+"}:load")
		if p != reg && (len(prims) == 0 || prims[0] != p) {
			models, prims = append(models, m), append(prims, p)
		}
	}
	if len(models) < 2 {
		t.Fatal("no two models on different primaries, apart from the registry's")
	}
	faulty := prims[0]
	if target == faultRegistry {
		faulty = reg
	}
	st, err := store.OpenConfig(ctx, store.Config{Addrs: c.Addrs()}, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() }) // after the router's task (faultRouter) stops
	rt := faultRouter(t, st, 5)

	// Each model: two event-fed replicas; replica 0 holds the prompt.
	r := rand.New(rand.NewPCG(11, 11))
	prompts := map[string][]uint32{}
	for _, m := range models {
		prompts[m] = heldPrompt(t, ctx, st, rt, m, r)
	}
	cacheAware := func(m string, d router.Decision) bool {
		return !d.Degraded && d.Replica.ID == m+"-r0" && d.Matched == 8
	}
	for _, m := range models {
		t.Run("decide "+m, func(t *testing.T) {
			// A cluster just formed may still be settling its
			// configuration (and the router backs off after a failed
			// call): allow it a few seconds.
			var d router.Decision
			wait.UntilNil(t, "a cache-aware decision", func() error {
				var err error
				if d, err = rt.Route(ctx, router.Request{Model: m, Tokens: prompts[m]}); err != nil || !cacheAware(m, d) {
					return fmt.Errorf("route = %+v, %v; want %s-r0 with 8 matched blocks, not degraded", d, err, m)
				}
				return nil
			})
			if ok, err := rt.Release(ctx, d.RequestID); err != nil || !ok {
				t.Errorf("release = %v, %v; want true", ok, err)
			}
		})
	}

	// Traffic: decisions alternating models, ~10 ms apart, and a direct
	// store lookup beside each, until both models decide cache-aware again
	// after the restart, or 40 s have passed (a busy machine slows the
	// decisions, not the cluster's clocks, so the budget is time).
	type result struct {
		at       time.Time
		took     time.Duration
		model    string
		degraded bool
		aware    bool
		replica  string
		matched  int
		// queued is how many of this pod's progress reports were
		// waiting for the store when the decision began.
		queued int
	}
	var (
		mu      sync.Mutex
		results []result
		errs    = map[string]int{}
		back    time.Time // when the primary was back
		downAt  time.Time // when it went down
	)
	done := make(chan struct{})
	restartFailed := make(chan struct{})
	// The fault's schedule follows the traffic, not the clock: the
	// primary goes down once decisions are flowing (under traffic), and
	// comes back once the traffic has met the outage (a degraded
	// decision, and for the model's primary a store error too), or the
	// traffic has stopped.
	flowing, bitten, stopped := make(chan struct{}), make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		// Start fails the test with runtime.Goexit when the node cannot
		// come back: say so to the traffic loop, which would otherwise
		// wait out its budget for a recovery that cannot happen.
		ok := false
		defer func() {
			if !ok {
				close(restartFailed)
			}
		}()
		select {
		case <-flowing:
		case <-stopped:
		}
		mu.Lock()
		downAt = time.Now()
		mu.Unlock()
		down(faulty)
		select {
		case <-bitten:
		case <-stopped:
		}
		// And once the cluster has marked it failed (its 1 s node
		// timeout), so that its slots answer CLUSTERDOWN for a while.
		for !c.MarkedFailed(faulty) {
			select {
			case <-stopped:
			case <-time.After(20 * time.Millisecond):
				continue
			}
			break
		}
		up(faulty)
		mu.Lock()
		back = time.Now()
		mu.Unlock()
		ok = true
	}()
	recovered := map[string]time.Time{}
	budget := time.Now().Add(40 * time.Second)
	degradedSeen := false
	for i := 0; len(recovered) < 2 && time.Now().Before(budget); i++ {
		if i == 10 {
			close(flowing)
		}
		select {
		case <-restartFailed:
			t.Fatal("the primary could not be brought back; see above")
		default:
		}
		m := models[i%2]
		t0 := time.Now()
		queued := rt.Queued()
		d, err := rt.Route(ctx, router.Request{Model: m, Tokens: prompts[m]})
		took := time.Since(t0)
		if err != nil {
			// Not Fatal: the restarting goroutine still uses t.
			t.Errorf("decision %d (%s) failed: %v; want an answer, degraded at worst", i, m, err)
			break
		}
		// A release that meets the outage is queued for retry, by design
		// (it must not hold the caller); the proxy releases degraded
		// decisions too.
		if _, err := rt.Release(ctx, d.RequestID); err != nil && !errors.Is(err, router.ErrQueued) {
			t.Errorf("release: %v", err)
			break
		}
		keys := kvroute.BlockKeys(rt.KeySpace(m, ""), bs, prompts[m], nil)
		lctx, lcancel := context.WithTimeout(ctx, 250*time.Millisecond)
		_, _, lerr := st.Lookup(lctx, m, keys, []string{m + "-r0"})
		lcancel()
		mu.Lock()
		if lerr != nil {
			if !errors.Is(lerr, kvroute.ErrUnavailable) {
				t.Errorf("store error not marked unavailable: %v", lerr)
			}
			errs[lerr.Error()]++
		}
		now := time.Now()
		results = append(results, result{at: now, took: took, model: m, degraded: d.Degraded, aware: cacheAware(m, d), replica: d.Replica.ID, matched: d.Matched, queued: queued})
		if !back.IsZero() && cacheAware(m, d) {
			if _, ok := recovered[m]; !ok {
				recovered[m] = now
			}
		}
		if was := degradedSeen; !was && d.Degraded && (target != faultModel || len(errs) > 0) {
			degradedSeen = true
			close(bitten)
		}
		mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	close(stopped)
	<-done
	degraded, per, blind, slowest := 0, map[string]int{}, map[string]int{}, map[string]time.Duration{}
	for _, res := range results {
		switch {
		case res.degraded:
			degraded++
			per[res.model]++
		case !res.aware:
			// A release that met the outage is queued, and until it lands
			// its booking loads the holder for every decision (and a
			// booking whose answer the outage lost still counts): going
			// elsewhere then is the load view's due. With nothing queued,
			// it is a booking or a release gone astray.
			if res.queued == 0 {
				blind[res.model]++
			}
			// What a failure needs to be read: when, against the fault,
			// and where it went.
			t.Logf("cache-blind: %s at +%v from the fault (%v from its end): %s, %d matched, %d reports queued",
				res.model, res.at.Sub(downAt).Round(time.Millisecond), res.at.Sub(back).Round(time.Millisecond), res.replica, res.matched, res.queued)
		}
		slowest[res.model] = max(slowest[res.model], res.took)
	}
	// The router backs off per failure domain (a Cluster slot; the global
	// keys apart): a model on a healthy primary never notices the outage,
	// and a registry that cannot be read costs one decision a window.
	t.Logf("%s down: %d decisions, %d degraded (%v), not degraded but cache-blind %v, slowest %v; store errors: %v",
		target, len(results), degraded, per, blind, slowest, errs)
	for m, d := range slowest {
		if d > time.Second {
			t.Errorf("%s: slowest decision took %v, want well inside the 2 s request deadline", m, d)
		}
	}
	// loadsNow is what a failure message shows of a model's two replicas.
	loadsNow := func(m string) string {
		loads, err := st.Loads(ctx, m, []string{m + "-r0", m + "-r1"})
		return fmt.Sprintf("%+v %v", loads, err)
	}
	for _, m := range models {
		if n := blind[m]; n > 0 {
			t.Errorf("%s: %d decisions answered as cache-aware went elsewhere than the prefix's holder (its bookings or releases went astray); loads r0, r1 now: %s", m, n, loadsNow(m))
		}
	}
	switch target {
	case faultModel:
		if n := per[models[1]]; n > 0 {
			t.Errorf("%s, on a healthy primary: %d decisions degraded during the other primary's outage, want 0", models[1], n)
		}
	case faultRegistry:
		// The outage, with the cluster's detection and recovery, lasts a
		// few seconds: a few windows of one second.
		if degraded > 12 {
			t.Errorf("%d decisions degraded while only the registry's primary was down, want a few (one a back-off window)", degraded)
		}
	}
	for _, m := range models {
		at, ok := recovered[m]
		if !ok {
			var last result
			for _, res := range results {
				if res.model == m {
					last = res
				}
			}
			t.Errorf("%s: no cache-aware decision within 40 s of traffic after the primary came back (%s at %v); the last went to %s with %d matched (degraded %v); loads r0, r1: %s",
				m, upVerb, back.Format(time.StampMilli), last.replica, last.matched, last.degraded, loadsNow(m))
			continue
		}
		t.Logf("%s: cache-aware again %v after the primary was %s", m, at.Sub(back).Round(time.Millisecond), upVerb)
		if at.Sub(back) > 20*time.Second {
			t.Errorf("%s: recovery took %v, want under 20s", m, at.Sub(back))
		}
	}
	if degraded == 0 || (target == faultModel && len(errs) == 0) {
		t.Errorf("no degraded decision (%d) or store error (%d) while a primary was down: the fault did not bite", degraded, len(errs))
	}
}
