package ingestor_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute"
)

// TestIngestorDataParallel: a replica whose metrics label three engines
// is learned to be data-parallel, then followed engine by engine, each
// engine's load from its own series, and its /health probed once per
// round, not once per engine.
func TestIngestorDataParallel(t *testing.T) {
	var health, scrapes atomic.Int64
	h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/health":
			health.Add(1)
		case "/metrics":
			scrapes.Add(1)
			for rank := range 3 {
				fmt.Fprintf(w, "vllm:num_requests_waiting{engine=\"%d\"} %d\nvllm:num_requests_running{engine=\"%d\"} %d\nvllm:kv_cache_usage_perc{engine=\"%d\"} 0.%d\n",
					rank, rank, rank, 10+rank, rank, rank+1)
			}
		}
	}))
	defer h.Close()
	st := newFakeStore()
	st.setReplicas(kvroute.Replica{ID: "dp", Model: "m", URL: h.URL})
	in, _, stop := startIngestor(t, st, "")
	defer stop()
	eventually(t, "three engines followed", func() bool {
		o := in.Owned()
		slices.Sort(o)
		return slices.Equal(o, []string{"dp/0", "dp/1", "dp/2"})
	})
	eventually(t, "each engine loaded from its own series", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.scraped["dp/1"] == [3]float64{1, 11, 0.2} && st.scraped["dp/2"] == [3]float64{2, 12, 0.3}
	})
	st.mu.Lock()
	if _, ok := st.health["dp/1"]; ok {
		t.Error("health written for an engine, want the registered replica")
	}
	if _, ok := st.health["dp"]; !ok {
		t.Error("no health written for dp")
	}
	st.mu.Unlock()
	// Probes and scrapes run on the same interval: once a server each,
	// they keep pace; once an engine each, probes would run three to one.
	h0, s0 := health.Load(), scrapes.Load()
	eventually(t, "six more scrapes", func() bool { return scrapes.Load() >= s0+6 })
	if dh, ds := health.Load()-h0, scrapes.Load()-s0; dh > ds+2 {
		t.Errorf("%d health probes against %d scrapes, want one probe a server a round", dh, ds)
	}
}
