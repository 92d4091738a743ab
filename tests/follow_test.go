package tests_test

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/vllmtest"
)

// TestFollowingStartsQuickly: with the ingestor's default intervals, a
// replica registered through the API is followed (its replay buffer
// caught up) within a second, and until then decisions for it say the
// index is incomplete rather than pass a cache-blind answer off as
// cache-aware. Before, following started ~5 s after registration (the
// next lease renewal) and nothing said so.
func TestFollowingStartsQuickly(t *testing.T) {
	h := newHarness(t)
	ing, _ := h.startIngestor("quick", h.st, func(c *ingestor.Config) {
		c.RegistryInterval, c.LeaseTTL = 0, 0 // the defaults
	})
	_ = ing
	start := time.Now()
	h.addReplica("r0", vllmtest.Config{})
	prompt := make([]int, 4*bs)
	for i := range prompt {
		prompt[i] = i + 1
	}
	first := routeIncomplete(t, h, prompt)
	var followed time.Duration
	h.waitFor("r0 followed", func() bool {
		_, body := h.call(http.MethodGet, "/v1/replicas", "")
		var list struct {
			Replicas []struct {
				FollowedSince time.Time `json:"followed_since"`
			} `json:"replicas"`
		}
		if json.Unmarshal([]byte(body), &list) == nil && len(list.Replicas) == 1 && !list.Replicas[0].FollowedSince.IsZero() {
			followed = time.Since(start)
			return true
		}
		return false
	})
	t.Logf("followed %v after registration; first decision index_incomplete=%v", followed.Round(time.Millisecond), first)
	if followed > 1500*time.Millisecond {
		t.Errorf("following started %v after registration, want within ~1 s", followed)
	}
	// The pod's registry cache catches up by itself.
	wait.Until(t, "a decision after the replica was followed without index_incomplete", func() bool { return !routeIncomplete(t, h, prompt) })
}

func routeIncomplete(t *testing.T, h *harness, prompt []int) bool {
	t.Helper()
	b, _ := json.Marshal(map[string]any{"model": model, "token_ids": prompt})
	code, body := h.call(http.MethodPost, "/v1/route", string(b))
	if code != http.StatusOK {
		t.Fatalf("route: %d %s", code, body)
	}
	var d struct {
		IndexIncomplete bool `json:"index_incomplete"`
	}
	_ = json.Unmarshal([]byte(body), &d)
	return d.IndexIncomplete
}
