package api

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/router"
)

// metrics are the API's Prometheus series. Decisions are counted here, at
// the edge, so that decisions taken for /v1/route and for the proxy land in
// the same series.
type metrics struct {
	decisions *prometheus.CounterVec
	latency   prometheus.Histogram
	errors    *prometheus.CounterVec
	matched   prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_decisions_total",
			Help: "Routing decisions made, by policy and whether the state store was bypassed (degraded).",
		}, []string{"policy", "degraded"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_decision_duration_seconds",
			Help:    "Time to make one routing decision, store round trips included.",
			Buckets: []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5},
		}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_api_errors_total",
			Help: "Error answers, by API error code.",
		}, []string{"code"}),
		matched: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "kvroute_matched_block_ratio",
			Help:    "Fraction of a prompt's full blocks already cached on the chosen replica (decisions with at least one block).",
			Buckets: prometheus.LinearBuckets(0, 0.1, 11),
		}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.latency, m.errors, m.matched} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observe(d router.Decision, took time.Duration) {
	m.decisions.WithLabelValues(string(d.Policy), strconv.FormatBool(d.Degraded)).Inc()
	m.latency.Observe(took.Seconds())
	if d.PromptBlocks > 0 {
		m.matched.Observe(float64(min(d.Matched, d.PromptBlocks)) / float64(d.PromptBlocks))
	}
}
