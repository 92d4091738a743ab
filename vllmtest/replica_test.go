package vllmtest_test

import (
	"context"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/vllmtest"
)

func TestLRU(t *testing.T) {
	r := start(t, vllmtest.Config{BlockSize: 4, CapacityBlocks: 3})
	a, b := seqTokens(1, 8), seqTokens(50, 8)
	mustAdmit(t, r, a, "", 0)
	// a is exactly 2 full blocks, both held, but vLLM recomputes the
	// prompt's last token, so only 1 block (4 tokens) is served cached.
	mustAdmit(t, r, a, "", 4) // refreshes a
	mustAdmit(t, r, b, "", 0) // evicts a's tail block
	if got := r.Contains(a, ""); got != 1 {
		t.Errorf("Contains(a) = %d, want 1", got)
	}
	if got := r.Contains(b, ""); got != 2 {
		t.Errorf("Contains(b) = %d, want 2", got)
	}
	mustAdmit(t, r, a, "", 4) // block 0 hit, block 1 evicts b's tail
	if got := r.Contains(b, ""); got != 1 {
		t.Errorf("Contains(b) = %d, want 1", got)
	}
	if got := r.CachedBlocks(); got != 3 {
		t.Errorf("CachedBlocks = %d, want 3", got)
	}
	t.Run("longer than the cache", func(t *testing.T) {
		mustAdmit(t, r, seqTokens(200, 40), "", 0)
		if got := r.CachedBlocks(); got != 3 {
			t.Errorf("CachedBlocks = %d, want 3", got)
		}
	})
}

func TestGivenEndpoints(t *testing.T) {
	r := start(t, vllmtest.Config{EventsEndpoint: "tcp://*:0", ReplayEndpoint: "tcp://127.0.0.1:0", HTTPAddr: "127.0.0.1:0", BlockSize: 4})
	if !strings.HasPrefix(r.EventsEndpoint(), "tcp://127.0.0.1:") || strings.HasSuffix(r.EventsEndpoint(), ":0") {
		t.Errorf("EventsEndpoint = %q, want a dialable loopback endpoint", r.EventsEndpoint())
	}
	sub := subscribe(t, r)
	mustAdmit(t, r, seqTokens(1, 4), "", 0)
	if b := live(t, sub); b.seq != 0 {
		t.Errorf("seq = %d, want 0", b.seq)
	}
}

func TestStartContextStops(t *testing.T) {
	r, err := vllmtest.New(vllmtest.Config{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	wait.Until(t, "the replica to stop serving after its context ended", func() bool {
		resp, err := http.Get(r.URL() + "/health")
		if err != nil {
			return true
		}
		resp.Body.Close()
		return false
	})
	if err := r.Stop(); err != nil {
		t.Errorf("Stop after cancel: %v", err)
	}
}

func TestNewRejects(t *testing.T) {
	for name, cfg := range map[string]vllmtest.Config{
		"no model":         {},
		"unknown encoding": {Model: "m", EventEncoding: "json"},
		"negative size":    {Model: "m", BlockSize: -1},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := vllmtest.New(cfg); err == nil {
				t.Error("New succeeded, want an error")
			}
		})
	}
}
