package tests_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

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
