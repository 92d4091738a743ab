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

	"github.com/kvroute/kvroute/vllmtest"
)

// TestRedisRestartedEmpty reproduces Redis losing its data under traffic:
// a registered fleet, decisions flowing, redis-server killed (-9) and
// started again empty on the same port 3 s later. Before, every decision
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
			mu.Unlock()
			time.Sleep(10 * time.Millisecond)
		}
	})
	time.Sleep(500 * time.Millisecond)
	rp.kill(syscall.SIGKILL)
	time.Sleep(3 * time.Second)
	rp.start()
	restarted := time.Now()

	var recovered time.Duration
	for {
		a := p.decide(t, model, prompts[1])
		if a.status == http.StatusOK && a.Matched > 0 {
			recovered = time.Since(restarted)
			break
		}
		if time.Since(restarted) > 10*time.Second {
			t.Errorf("no prompt matched 10 s after the restart; last decision %+v", a)
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	time.Sleep(500 * time.Millisecond)
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
