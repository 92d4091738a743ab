package tests_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/vllmtest"
)

// TestRedisRestartedEmpty reproduces Redis losing its data under traffic:
// a registered fleet, decisions flowing, redis-server killed (-9) and
// started again empty on the same port once a decision met the outage. Before, every decision
// after the restart answered 404 model_not_found until the replicas were
// registered again by hand. Now: no decision for the registered model is
// ever a 404, the pod re-seeds the registry, the ingestor follows the
// replicas again and rebuilds the index from their replay buffers, and a
// prompt the replicas hold is matched again within 10 s of the restart.
func TestRedisRestartedEmpty(t *testing.T) {
	rp := startRedisProc(t)
	p := startPod(t, rp.url())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	h := &harness{t: t, ctx: ctx, url: rp.url(), app: p.a, base: p.base, reps: map[string]*vllmtest.Replica{}}
	h.st = h.openStore()
	for i := range 2 {
		h.addReplica(fmt.Sprintf("r%d", i), vllmtest.Config{})
	}
	ing, _ := h.startIngestor("reset", h.st)
	h.waitOwned(ing)

	// The replicas cache a few prompts, through the proxy.
	var prompts [][]uint32
	for i := range 4 {
		pr := seqTokens(10_000*(i+1), 8*bs)
		prompts = append(prompts, pr)
		complete(t, p.base, pr)
	}
	for id := range h.reps {
		h.synced(id)
	}
	if a := p.decide(t, model, prompts[0]); a.Matched == 0 || a.Degraded {
		t.Fatalf("before the restart: %+v", a)
	}

	// Traffic all along: count what every decision answered.
	stop := make(chan struct{})
	var mu sync.Mutex
	statuses := map[int]int{}
	decided, degraded := 0, 0
	var wg sync.WaitGroup
	wg.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			a := p.decide(t, model, prompts[i%len(prompts)])
			mu.Lock()
			statuses[a.status]++
			decided++
			if a.Degraded {
				degraded++
			}
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	})
	// The schedule follows the traffic: Redis dies once decisions flow,
	// comes back once one met the outage (degraded), and the traffic
	// goes on for as many decisions again after the recovery.
	counts := func() (int, int) { mu.Lock(); defer mu.Unlock(); return decided, degraded }
	wait.Until(t, "decisions flowing", func() bool { n, _ := counts(); return n >= 10 })
	rp.kill(syscall.SIGKILL)
	wait.Until(t, "a decision degraded by the outage", func() bool { _, d := counts(); return d > 0 })
	rp.start()
	restarted := time.Now()

	var last routeAnswer
	wait.Until(t, "a prompt matched again after the restart", func() bool {
		last = p.decide(t, model, prompts[1])
		return last.status == http.StatusOK && last.Matched > 0
	})
	recovered := time.Since(restarted)
	if recovered > 10*time.Second {
		t.Errorf("a prompt matched again only %v after the restart, want within 10 s; last decision %+v", recovered, last)
	}
	n0, _ := counts()
	wait.Until(t, "ten decisions after the recovery", func() bool { n, _ := counts(); return n >= n0+10 })
	close(stop)
	wg.Wait()
	t.Logf("decisions by status across the outage: %v; matched blocks back %v after the restart", statuses, recovered.Round(10*time.Millisecond))
	if statuses[http.StatusNotFound] > 0 {
		t.Errorf("%d decisions answered 404 for a model that had replicas", statuses[http.StatusNotFound])
	}
	for code, n := range statuses {
		if code != http.StatusOK {
			t.Errorf("%d decisions answered %d", n, code)
		}
	}
	if code, body := h.call(http.MethodGet, "/v1/replicas", ""); code != http.StatusOK || strings.Count(body, `"id":`) != 2 {
		t.Errorf("registry after recovery: %d %s, want both replicas back", code, body)
	}
}

// complete sends one completion of token ids through the proxy, so that
// the chosen replica caches the prompt.
func complete(t *testing.T, base string, tokens []uint32) {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": tokens, "max_tokens": 1})
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("completion: %d", resp.StatusCode)
	}
}

// TestStoreResetRecovers repeats what an outside pass found on a quiet
// fleet: a prompt cached and followed, then only decisions (no engine
// event), and redis-server killed (-9) and started again empty. The
// ingestor runs with its default registry poll and stream-silence
// timeout, as `kvroute ingest` does. Before, the holder matched again
// after 0.1–1.0 s in a few runs (the ingestor's registry poll happened to
// see the empty registry) and after 9–20 s or more in most (its followers
// kept their sequence until the 30 s silence timer), and decisions said
// degraded for a fixed 15 s, then nothing while the index was still empty.
// Now, in each of 20 restarts, quiet or busy (completions through the
// proxy all along): every decision from the restart until the first one
// that is cache-aware on the holder says degraded or index_incomplete,
// and none after it says either; quiet, that one comes within 2 s of the
// restart (0.85–1.3 s here, most of it the pod's 1 s store back-off).
// Busy, the pod's store back-off sometimes holds decisions degraded
// (store unreachable) past 2 s after the restart, and a decision was
// once answered only seconds after it, before the index matters (see
// DESIGN.md): busy is bounded at 10 s.
func TestStoreResetRecovers(t *testing.T) {
	for _, busy := range []bool{false, true} {
		name := "quiet"
		if busy {
			name = "busy"
		}
		t.Run(name, func(t *testing.T) { testRestartsRecover(t, busy, 20) })
	}
}

func testRestartsRecover(t *testing.T, busy bool, runs int) {
	rp := startRedisProc(t)
	p := startPod(t, rp.url())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	h := &harness{t: t, ctx: ctx, url: rp.url(), app: p.a, base: p.base, reps: map[string]*vllmtest.Replica{}}
	h.st = h.openStore()
	for i := range 3 {
		h.addReplica(fmt.Sprintf("r%d", i), vllmtest.Config{})
	}
	ing, _ := h.startIngestor("reset", h.st, func(c *ingestor.Config) {
		c.RegistryInterval, c.StallTimeout = 0, 0 // the defaults
	})
	h.waitOwned(ing)
	pr := seqTokens(20_000, 8*bs)
	complete(t, p.base, pr)
	for id := range h.reps {
		h.synced(id)
	}
	var first resetDecision
	wait.Until(t, "a cache-aware decision on the holder, every replica followed", func() bool {
		first = decideAndRelease(t, p.base, pr, nil)
		return first.clean() && first.Matched > 0
	})
	log := &decisionLog{}
	// Busy, each decision's release goes on beside the next decisions, as
	// a proxied request's does: a release held up by the outage (queued
	// for retry after its store call timed out) must not stop the
	// decisions the recovery is measured by. At most a few are in
	// flight: thousands once ran the process out of sockets. They are
	// waited for last, once the traffic that starts them has stopped.
	// Quiet, each is released before the next decision: a booking still
	// out loads the holder, and a decision may then rightly go elsewhere
	// (clean, matched 0), which quiet counts as a miss. A release held up
	// there only delays the degraded decision the restart waits for.
	var releases *releaser
	if busy {
		releases = newReleaser(2)
		defer releases.wait()
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer close(stop)
	wg.Go(func() {
		for !stopped(stop) {
			log.add(decideAndRelease(t, p.base, pr, releases))
		}
	})
	if busy {
		wg.Go(func() {
			for i := 0; !stopped(stop); i++ {
				// A few prompts over and over: new ones would evict
				// the holder's from the replica's cache.
				completeQuietly(p.base, seqTokens(100_000+1_000*(i%3), 4*bs))
			}
		})
	}
	var took []time.Duration
	for run := range runs {
		took = append(took, recoverOnce(t, rp, log, run, !busy))
	}
	slices.Sort(took)
	t.Logf("holder %s; matched blocks back after the restart in %d runs: min %v, median %v, max %v", first.Replica.ID, len(took),
		took[0].Round(time.Millisecond), took[len(took)/2].Round(time.Millisecond), took[len(took)-1].Round(time.Millisecond))
}

// recoverOnce kills redis-server, starts it again empty once a decision
// met the outage, and checks the decisions from the restart on; it
// returns how long after the restart the first cache-aware decision on
// the holder came. quiet also wants every decision after the recovery to
// match the holder's blocks (no other traffic loads it).
func recoverOnce(t *testing.T, rp *redisProc, log *decisionLog, run int, quiet bool) time.Duration {
	t.Helper()
	killed := time.Now()
	rp.kill(syscall.SIGKILL)
	wait.Until(t, "a decision degraded by the outage", func() bool {
		return slices.ContainsFunc(log.since(killed), func(d resetDecision) bool { return d.Degraded })
	})
	rp.start()
	restarted := time.Now()
	rec := -1
	wait.UntilNil(t, "a cache-aware decision on the holder after the restart", func() error {
		ds := log.since(restarted)
		if rec = slices.IndexFunc(ds, func(d resetDecision) bool { return d.clean() && d.Matched > 0 }); rec >= 0 {
			return nil
		}
		if len(ds) == 0 {
			return fmt.Errorf("run %d: no decision yet", run)
		}
		return fmt.Errorf("run %d: the last decision %+v", run, ds[len(ds)-1])
	})
	wait.Until(t, "five decisions after the recovery", func() bool { return len(log.since(restarted)) >= rec+6 })
	ds := log.since(restarted)
	took := ds[rec].end.Sub(restarted)
	if all := log.since(killed); len(all) > len(ds) {
		prev := all[len(all)-len(ds)-1]
		if gap := ds[0].start.Sub(restarted); gap > 500*time.Millisecond {
			t.Logf("run %d: the first decision after the restart was asked %v after it; the one before took %v and its release %v (asked %v before the restart)",
				run, gap, prev.end.Sub(prev.start), prev.released, restarted.Sub(prev.start))
		}
	}
	bound := 2 * time.Second
	if took > bound {
		seen := map[string]int{}
		for _, d := range ds[:rec] {
			seen[fmt.Sprintf("%s degraded=%v incomplete=%v matched=%d %.40s", d.Replica.ID, d.Degraded, d.IndexIncomplete, d.Matched, d.Reason)]++
		}
		t.Errorf("run %d: matched blocks back %v after the restart (that decision asked %v after it), want within %v; the decisions before: %v",
			run, took, ds[rec].start.Sub(restarted), bound, seen)
	}
	for i, d := range ds {
		switch {
		case d.status != http.StatusOK:
			t.Errorf("run %d: decision %d after the restart answered %d", run, i, d.status)
		case i < rec && !d.Degraded && !d.IndexIncomplete:
			t.Errorf("run %d: decision %d after the restart, before the recovery, says neither degraded nor index_incomplete: %+v", run, i, d)
		case i > rec && (!d.clean() || quiet && d.Matched == 0):
			t.Errorf("run %d: decision %d after the recovery: %+v, want cache-aware, neither degraded nor index_incomplete", run, i, d)
		}
	}
	return took
}

// resetDecision is one /v1/route answer and when it was asked and answered.
// It is a routeAnswer (outage_test.go) with what recovery is judged by.
type resetDecision struct {
	routeAnswer
	start, end      time.Time
	released        time.Duration // how long the release took
	IndexIncomplete bool          `json:"index_incomplete"`
	// ExpiresAt is set when the decision booked load (not when it
	// bypassed the store), which is what a release is owed for.
	ExpiresAt time.Time `json:"expires_at"`
}

// clean is a decision that says nothing is wrong with what it saw.
func (d resetDecision) clean() bool {
	return d.status == http.StatusOK && !d.Degraded && !d.IndexIncomplete
}

// releaser runs releases beside the decisions, at most cap of them at
// once: one more waits for a slot.
type releaser struct {
	slots chan struct{}
	wg    sync.WaitGroup
}

func newReleaser(n int) *releaser { return &releaser{slots: make(chan struct{}, n)} }

func (r *releaser) do(release func()) {
	r.slots <- struct{}{}
	r.wg.Go(func() {
		defer func() { <-r.slots }()
		release()
	})
}

func (r *releaser) wait() { r.wg.Wait() }

// decideAndRelease asks for one decision on tokens and releases its
// booking, so that the holder's load stays what it was; async nil
// releases before returning. A decision that booked nothing (it bypassed
// the store) is not released: its release would only wait on the outage.
func decideAndRelease(t *testing.T, base string, tokens []uint32, async *releaser) resetDecision {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second}
	body, _ := json.Marshal(map[string]any{"model": model, "token_ids": tokens, "max_tokens": 16})
	d := resetDecision{start: time.Now()}
	resp, err := c.Post(base+"/v1/route", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Errorf("route: %v", err)
		d.end = time.Now()
		return d
	}
	_ = json.NewDecoder(resp.Body).Decode(&d)
	resp.Body.Close()
	d.status, d.end = resp.StatusCode, time.Now()
	release := func() {
		if resp, err := c.Post(base+"/v1/requests/"+d.RequestID+"/release", "application/json", nil); err == nil {
			resp.Body.Close()
		}
	}
	switch {
	case d.status != http.StatusOK || d.ExpiresAt.IsZero():
	case async != nil:
		async.do(release)
	default:
		rs := time.Now()
		release()
		d.released = time.Since(rs)
	}
	return d
}

// completeQuietly sends one completion through the proxy, its outcome
// ignored: the busy fleet's traffic, which makes the replicas publish.
func completeQuietly(base string, tokens []uint32) {
	c := &http.Client{Timeout: 10 * time.Second}
	b, _ := json.Marshal(map[string]any{"model": model, "prompt": tokens, "max_tokens": 1})
	if resp, err := c.Post(base+"/v1/completions", "application/json", strings.NewReader(string(b))); err == nil {
		resp.Body.Close()
	}
}

// decisionLog is every decision of a test's traffic, in order.
type decisionLog struct {
	mu sync.Mutex
	ds []resetDecision
}

func (l *decisionLog) add(d resetDecision) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ds = append(l.ds, d)
}

// since returns the decisions asked at or after t, in order.
func (l *decisionLog) since(t time.Time) []resetDecision {
	l.mu.Lock()
	defer l.mu.Unlock()
	i := slices.IndexFunc(l.ds, func(d resetDecision) bool { return !d.start.Before(t) })
	if i < 0 {
		return nil
	}
	return slices.Clone(l.ds[i:])
}

func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}
