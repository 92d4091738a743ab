package api

import (
	"context"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/prompt"
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
	// tokenization counts decisions by where their ids came from, blind
	// the cache-blind ones by reason.
	tokenization *prometheus.CounterVec
	blind        *prometheus.CounterVec
	// Believed versus served, per replica: what the index promised of a
	// proxied prompt and what the replica reported serving from cache.
	believed   *prometheus.CounterVec
	servedTok  *prometheus.CounterVec
	compared   *prometheus.CounterVec
	phantom    *prometheus.CounterVec
	unreported *prometheus.CounterVec
	// byReplica counts decisions per chosen replica; degraded the
	// decisions made without the store or the prompt's ids, by reason.
	byReplica *prometheus.CounterVec
	degraded  *prometheus.CounterVec
	// proxied counts proxied requests by the replica's status ("error":
	// none came), failovers the replicas a proxied request left.
	proxied   *prometheus.CounterVec
	failovers *prometheus.CounterVec
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
	m.tokenization = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_decisions_by_tokenization_total",
		Help: "Routing decisions by where the prompt's token ids came from: given, local, remote, or none (cache-blind).",
	}, []string{"source"})
	m.blind = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_decisions_cache_blind_total",
		Help: "Routing decisions made without the prompt's token ids (on load alone), by reason.",
	}, []string{"reason"})
	perReplica := func(name, help string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, []string{"replica"})
	}
	m.believed = perReplica("kvroute_cached_tokens_believed_total", "Prompt tokens the index said the chosen replica held, for proxied responses that reported cached tokens.")
	m.servedTok = perReplica("kvroute_cached_tokens_served_total", "Prompt tokens the replica reported serving from its prefix cache (usage.prompt_tokens_details.cached_tokens).")
	m.compared = perReplica("kvroute_cache_compared_total", "Proxied responses whose cached-token count was compared with the index's belief.")
	m.phantom = perReplica("kvroute_cache_phantom_total", "Compared responses where the replica served fewer cached tokens than the index believed (a stale index); divide by kvroute_cache_compared_total for the phantom rate.")
	m.unreported = perReplica("kvroute_cache_unreported_total", "Proxied responses without a cached-token count (run vLLM with --enable-prompt-tokens-details).")
	m.byReplica = perReplica("kvroute_decisions_by_replica_total", "Routing decisions, by the replica chosen.")
	m.degraded = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_decisions_degraded_total",
		Help: "Routing decisions made without the state store or without the prompt's token ids, by reason (the values of X-Kvroute-Degraded-Reason).",
	}, []string{"reason"})
	m.proxied = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvroute_proxied_requests_total",
		Help: "Proxied OpenAI requests, by the replica's HTTP status (307: redirected; error: the replica never answered).",
	}, []string{"status"})
	m.failovers = perReplica("kvroute_proxy_failovers_total", "Proxied requests whose replica failed before answering (then marked suspect and, when another was eligible, replaced), by the failed replica.")
	for _, c := range []prometheus.Collector{m.decisions, m.latency, m.errors, m.matched, m.tokenization, m.blind,
		m.believed, m.servedTok, m.compared, m.phantom, m.unreported, m.byReplica, m.degraded, m.proxied, m.failovers} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func (m *metrics) observe(d router.Decision, p prompt.Result, took time.Duration) {
	m.decisions.WithLabelValues(string(d.Policy), strconv.FormatBool(d.Degraded)).Inc()
	m.tokenization.WithLabelValues(string(p.Source)).Inc()
	if p.Blind != "" {
		m.blind.WithLabelValues(p.Blind).Inc()
		m.degraded.WithLabelValues(p.Blind).Inc()
	}
	if d.Degraded {
		m.degraded.WithLabelValues(ReasonStoreUnavailable).Inc()
	}
	m.byReplica.WithLabelValues(d.Replica.ID).Inc()
	m.latency.Observe(took.Seconds())
	if d.PromptBlocks > 0 {
		m.matched.Observe(float64(min(d.Matched, d.PromptBlocks)) / float64(d.PromptBlocks))
	}
}

// served records a proxied response's cached tokens against the belief.
func (m *metrics) served(replica string, believed int, u usage) {
	if !u.Reported {
		m.unreported.WithLabelValues(replica).Inc()
		return
	}
	m.compared.WithLabelValues(replica).Inc()
	m.believed.WithLabelValues(replica).Add(float64(believed))
	m.servedTok.WithLabelValues(replica).Add(float64(u.Cached))
	if believed > u.Cached {
		m.phantom.WithLabelValues(replica).Inc()
	}
}

// registrySize reports the registry's replicas by model and health at
// scrape time, from the registry itself (bounded by a short timeout; a
// store that does not answer leaves the series out of that scrape).
type registrySize struct {
	reg  Registry
	desc *prometheus.Desc
}

func newRegistrySize(reg Registry) *registrySize {
	return &registrySize{reg: reg, desc: prometheus.NewDesc("kvroute_registry_replicas",
		"Registered replicas, by model and health (healthy, unhealthy, or unknown: not probed yet).", []string{"model", "health"}, nil)}
}

func (c *registrySize) Describe(ch chan<- *prometheus.Desc) { ch <- c.desc }

func (c *registrySize) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	reps, err := c.reg.ListReplicas(ctx)
	if err != nil {
		return
	}
	type key struct{ model, health string }
	n := map[key]int{}
	for _, r := range reps {
		h := string(r.Health)
		if h == "" {
			h = "unknown"
		}
		n[key{r.Model, h}]++
	}
	for k, v := range n {
		ch <- prometheus.MustNewConstMetric(c.desc, prometheus.GaugeValue, float64(v), k.model, k.health)
	}
}
