package ingestor_test

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute"
)

// TestProbesDoNotFollowRedirects is the SSRF finding's probe half: a
// registered replica that answers /health and /metrics with a redirect
// must not walk the ingestor to another address (a metadata service), and
// a redirect is a failed probe.
func TestProbesDoNotFollowRedirects(t *testing.T) {
	var hits atomic.Int64
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		w.Write([]byte("vllm:num_requests_running 1\n"))
	}))
	defer target.Close()
	replica := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.Redirect(w, r, target.URL+r.URL.Path, http.StatusFound)
	}))
	defer replica.Close()
	st := newFakeStore()
	st.setReplicas(kvroute.Replica{ID: "r1", Model: "m", URL: replica.URL})
	_, _, stop := startIngestor(t, st, "")
	defer stop()
	eventually(t, "r1 probed unhealthy", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.health["r1"] == kvroute.HealthUnhealthy
	})
	stop()
	if got := hits.Load(); got != 0 {
		t.Errorf("the redirect target got %d requests, want 0", got)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, ok := st.scraped["r1"]; ok {
		t.Error("metrics scraped through a redirect")
	}
}
