package ingestor_test

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// series gathers reg and returns the named family's samples by their
// labels (name=value, comma-joined; "" for none), gauges and counters.
func series(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := ""
			for i, lp := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += lp.GetName() + "=" + lp.GetValue()
			}
			out[key] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	return out
}

// TestMetricsExport: the ingestor's instruments read on /metrics as the
// Prometheus client's collectors did.
func TestMetricsExport(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newMetrics(t, reg)
	t.Run("unlabelled series are served at 0 before any event", func(t *testing.T) {
		for _, name := range []string{"kvroute_ingest_gaps_total", "kvroute_ingest_blocks_stored_total", "kvroute_ingest_owned_replicas"} {
			if got := series(t, reg, name); len(got) != 1 || got[""] != 0 {
				t.Errorf("%s = %v, want one series at 0", name, got)
			}
		}
	})
	t.Run("a replica's stalled series goes when its worker does", func(t *testing.T) {
		m.SetStalled("r1", 1)
		m.SetStalled("r2", 0)
		if got := series(t, reg, "kvroute_ingest_stream_stalled"); len(got) != 2 || got["replica=r1"] != 1 || got["replica=r2"] != 0 {
			t.Fatalf("stalled = %v, want r1 at 1 and r2 at 0", got)
		}
		m.ClearStalled("r1")
		if got := series(t, reg, "kvroute_ingest_stream_stalled"); len(got) != 1 || got["replica=r2"] != 0 {
			t.Errorf("stalled after r1's worker stopped = %v, want r2 alone", got)
		}
	})
}
