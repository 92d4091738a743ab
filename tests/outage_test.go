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

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/store"
)

// pod is one kvroute serve process (in-process, the production wiring).
type pod struct {
	a    *app.App
	base string
}

func startPod(t *testing.T, redisURL string) *pod {
	t.Helper()
	return startPodWith(t, redisURL, func(*app.Config) {})
}

// startPodWith is startPod with its configuration edited by edit.
func startPodWith(t *testing.T, redisURL string, edit func(*app.Config)) *pod {
	t.Helper()
	rc := router.DefaultConfig()
	rc.RegistryTTL = 50 * time.Millisecond
	rc.Seed = seed // the harness's ingestors key with it
	cfg := app.Config{Listen: "127.0.0.1:0", RedisURL: redisURL, Router: rc, Tokenizers: app.Tokenizers{NoRemote: true}}
	edit(&cfg)
	a, err := app.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop() })
	return &pod{a: a, base: "http://" + a.Addr()}
}

type routeAnswer struct {
	status    int
	RequestID string `json:"request_id"`
	Replica   struct {
		ID string `json:"id"`
	} `json:"replica"`
	Matched  int    `json:"matched_blocks"`
	Degraded bool   `json:"degraded"`
	Reason   string `json:"reason"`
	took     time.Duration
}

// decide posts one decision for tokens of model.
func (p *pod) decide(t *testing.T, model string, tokens []uint32) routeAnswer {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"model": model, "token_ids": tokens, "max_tokens": 64})
	start := time.Now()
	resp, err := http.Post(p.base+"/v1/route", "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Errorf("route: %v", err)
		return routeAnswer{}
	}
	defer resp.Body.Close()
	var a routeAnswer
	_ = json.NewDecoder(resp.Body).Decode(&a)
	a.status, a.took = resp.StatusCode, time.Since(start)
	return a
}

func seqTokens(base, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(base + i)
	}
	return out
}

// registerFleet puts n replicas of model in the registry, each with an
// events endpoint (so decisions write no approximate entries), and has
// replica 0 hold the first blocks of prompt.
func registerFleet(t *testing.T, st *store.Store, rt *router.Router, model string, n int, prompt []uint32, held int) {
	t.Helper()
	ctx := context.Background()
	for i := range n {
		rep := kvroute.Replica{ID: fmt.Sprintf("%s-r%d", model, i), Model: model, URL: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:1"}
		if err := st.PutReplica(ctx, rep); err != nil {
			t.Fatal(err)
		}
	}
	keys := kvroute.BlockKeys(rt.KeySpace(model, ""), kvroute.DefaultBlockSize, prompt, kvroute.RequestExtras(""))
	holdChain(t, ctx, st, model, model+"-r0", keys[:min(held, len(keys))], 1, func(d int) uint64 { return uint64(1000 + d) })
}

// TestHungRedis reproduces a redis-server stopped by SIGSTOP under
// traffic: decisions must still answer well inside their 2 s deadline
// (degraded, round-robin over the known fleet), progress reports must not
// block their caller, the pod stays ready, and once the server is thawed
// the queued releases land and decisions are cache-aware again.
func TestHungRedis(t *testing.T) {
	rp := startRedisProc(t)
	p := startPod(t, rp.url())
	st, err := store.Open(context.Background(), rp.url(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	prompt := seqTokens(1, 64*16)
	registerFleet(t, st, p.a.Router, "hung", 2, prompt, 48)
	p.a.Router.Invalidate()

	var before []routeAnswer
	for range 4 {
		a := p.decide(t, "hung", prompt)
		if a.status != http.StatusOK || a.Degraded {
			t.Fatalf("before the hang: %+v", a)
		}
		before = append(before, a)
	}

	rp.kill(syscall.SIGSTOP)
	thawed := false
	defer func() {
		if !thawed {
			rp.kill(syscall.SIGCONT)
		}
	}()
	start := time.Now()
	var mu sync.Mutex
	var slowest time.Duration
	degraded, total := 0, 0
	var wg sync.WaitGroup
	for w := range 6 {
		wg.Go(func() {
			for i := 0; time.Since(start) < 700*time.Millisecond && i < 20; i++ {
				a := p.decide(t, "hung", prompt)
				mu.Lock()
				total++
				slowest = max(slowest, a.took)
				if a.status == http.StatusOK && a.Degraded {
					degraded++
				} else if a.status != http.StatusOK {
					t.Errorf("worker %d: decision during the hang: status %d", w, a.status)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	t.Logf("during the hang: %d decisions, %d degraded, slowest %v", total, degraded, slowest)
	if slowest > time.Second {
		t.Errorf("slowest decision during the hang took %v, want well inside the 2 s request timeout", slowest)
	}
	if degraded == 0 {
		t.Error("no decision was degraded during the hang")
	}
	t.Run("progress reports do not block", func(t *testing.T) {
		for _, a := range before {
			s := time.Now()
			resp, err := http.Post(p.base+"/v1/requests/"+a.RequestID+"/release", "application/json", nil)
			if err != nil {
				t.Fatal(err)
			}
			var pr struct {
				Queued bool `json:"queued"`
			}
			_ = json.NewDecoder(resp.Body).Decode(&pr)
			resp.Body.Close()
			if took := time.Since(s); took > 600*time.Millisecond {
				t.Errorf("release took %v during the hang, want it answered at once", took)
			}
			if resp.StatusCode != http.StatusAccepted || !pr.Queued {
				t.Errorf("release during the hang: %d queued=%v, want 202 queued (kvroute retries it)", resp.StatusCode, pr.Queued)
			}
		}
		if q := p.a.Router.Queued(); q == 0 {
			t.Error("no release was queued for retry")
		}
	})
	t.Run("still ready", func(t *testing.T) {
		resp, err := http.Get(p.base + "/readyz")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("readyz = %d during the hang, want 200: the pod still decides (degraded)", resp.StatusCode)
		}
	})

	rp.kill(syscall.SIGCONT)
	thawed = true
	t.Run("recovers by itself", func(t *testing.T) {
		wait.Until(t, "the queued progress reports delivered after the thaw", func() bool { return p.a.Router.Queued() == 0 })
		for _, a := range before {
			if found, err := st.Release(context.Background(), a.RequestID); err != nil || found {
				t.Errorf("lease %s: found %v (%v) after the queued release, want it gone", a.RequestID, found, err)
			}
		}
		wait.UntilNil(t, "a cache-aware decision after the thaw", func() error {
			if a := p.decide(t, "hung", prompt); a.status != http.StatusOK || a.Degraded || a.Matched == 0 {
				return fmt.Errorf("still degraded: %+v", a)
			}
			return nil
		})
	})
}
