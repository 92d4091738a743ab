package api

import (
	"context"
	"errors"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/router"
)

// meterName is the instrumentation scope of the API's instruments.
const meterName = "github.com/kvroute/kvroute/api"

// metrics are the API's decision series, made through the OpenTelemetry
// metrics API; the wiring's meter provider exports them on /metrics under
// exactly these names (suffixes included), labels and help texts, which
// are what operators scraped when they were Prometheus client collectors.
// Decisions are counted here, at the edge, so that decisions taken for
// /v1/route and for the proxy land in the same series.
type metrics struct {
	decisions metric.Int64Counter
	latency   metric.Float64Histogram
	errors    metric.Int64Counter
	matched   metric.Float64Histogram
	// stage is a decision's time per step (tokenize, registry, keying,
	// lookup, scoring, reserve): where a slow decision's time went.
	stage metric.Float64Histogram
	// tokenization counts decisions by where their ids came from, blind
	// the cache-blind ones by reason.
	tokenization metric.Int64Counter
	blind        metric.Int64Counter
	// Believed versus served, per replica: what the index promised of a
	// proxied prompt and what the replica reported serving from cache.
	believed   metric.Int64Counter
	servedTok  metric.Int64Counter
	compared   metric.Int64Counter
	phantom    metric.Int64Counter
	unreported metric.Int64Counter
	// byReplica counts decisions per chosen replica; degraded the
	// decisions made without the store or the prompt's ids, by reason.
	byReplica metric.Int64Counter
	degraded  metric.Int64Counter
	// proxied counts proxied requests by the replica's status ("error":
	// none came), failovers the replicas a proxied request left.
	proxied   metric.Int64Counter
	failovers metric.Int64Counter
	// headerTimeouts counts attempts whose replica sent no headers in
	// time (bound.go); streamErrors responses whose replica failed
	// after its headers (cut.go).
	headerTimeouts metric.Int64Counter
	streamErrors   metric.Int64Counter
	// pinIgnored counts data-parallel replicas found ignoring the rank
	// header (pincheck.go).
	pinIgnored metric.Int64Counter
	predicted  metric.Int64Counter
}

// Histogram bounds, as the Prometheus client histograms had them (the
// matched ratio's are prometheus.LinearBuckets(0, 0.1, 11)'s own floats,
// summed step by step as it sums them, so that every le label is the
// string it was: 0.30000000000000004, not 0.3).
var (
	latencyBounds = []float64{.0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5}
	stageBounds   = []float64{.00001, .000025, .00005, .0001, .00025, .0005, .001, .0025, .005, .01, .025, .05, .1, .25, .5, 1}
	matchedBounds = linearBounds(0, 0.1, 11)
)

// linearBounds is count bounds from start, width apart, each the sum of
// the one before and width.
func linearBounds(start, width float64, count int) []float64 {
	b := make([]float64, count)
	for i := range b {
		b[i] = start
		start += width
	}
	return b
}

func newMetrics(mp metric.MeterProvider, reg Registry) (*metrics, error) {
	mt := mp.Meter(meterName)
	errs := []error{observeRegistry(mt, reg)}
	counter := func(name, help string) metric.Int64Counter {
		c, err := mt.Int64Counter(name, metric.WithDescription(help))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, help string, bounds []float64) metric.Float64Histogram {
		h, err := mt.Float64Histogram(name, metric.WithDescription(help), metric.WithExplicitBucketBoundaries(bounds...))
		errs = append(errs, err)
		return h
	}
	m := &metrics{
		decisions: counter("kvroute_decisions_total", "Routing decisions made, by policy and whether the state store was bypassed (degraded)."),
		latency:   histogram("kvroute_decision_duration_seconds", "Time to make one routing decision, store round trips included.", latencyBounds),
		errors:    counter("kvroute_api_errors_total", "Error answers, by API error code."),
		matched: histogram("kvroute_matched_block_ratio",
			"Fraction of a prompt's full blocks already cached on the chosen replica (decisions with at least one block).", matchedBounds),
		stage: histogram("kvroute_decision_stage_duration_seconds",
			"Time one routing decision spent in each step, by stage: tokenize (the front door), registry, keying, lookup, scoring, reserve (lost booking races included).", stageBounds),
		tokenization: counter("kvroute_decisions_by_tokenization_total", "Routing decisions by where the prompt's token ids came from: given, local, remote, or none (cache-blind)."),
		blind:        counter("kvroute_decisions_cache_blind_total", "Routing decisions made without the prompt's token ids (on load alone), by reason."),
		believed:     counter("kvroute_cached_tokens_believed_total", "Prompt tokens the index said the chosen replica held, for proxied responses that reported cached tokens."),
		servedTok:    counter("kvroute_cached_tokens_served_total", "Prompt tokens the replica reported serving from its prefix cache (usage.prompt_tokens_details.cached_tokens)."),
		compared:     counter("kvroute_cache_compared_total", "Proxied responses whose cached-token count was compared with the index's belief."),
		phantom:      counter("kvroute_cache_phantom_total", "Compared responses where the replica served fewer cached tokens than the index believed (a stale index); divide by kvroute_cache_compared_total for the phantom rate."),
		unreported:   counter("kvroute_cache_unreported_total", "Proxied responses without a cached-token count (run vLLM with --enable-prompt-tokens-details)."),
		byReplica:    counter("kvroute_decisions_by_replica_total", "Routing decisions, by the replica chosen."),
		degraded:     counter("kvroute_decisions_degraded_total", "Routing decisions made without the state store or without the prompt's token ids, by reason (the values of X-Kvroute-Degraded-Reason)."),
		proxied:      counter("kvroute_proxied_requests_total", "Proxied OpenAI requests, by the replica's HTTP status (307: redirected; error: the replica never answered)."),
		failovers:    counter("kvroute_proxy_failovers_total", "Proxied requests whose replica failed before answering (then marked suspect and, when another was eligible, replaced), by the failed replica."),
		headerTimeouts: counter("kvroute_proxy_header_timeouts_total",
			"Proxied request attempts whose replica sent no response headers within the bound (--proxy-header-timeout; for a non-streaming request, plus its predicted duration): the replica is marked suspect and the request fails over, by replica."),
		streamErrors: counter("kvroute_proxy_stream_errors_total",
			"Proxied responses whose replica failed after the headers, before the body ended (sse=true: the client's stream ended with an error event), by replica and sse; the replica is marked suspect."),
		predicted: counter("kvroute_prediction_decisions_total",
			"Routing decisions in which some replica's cost counted a predicted entry (another request's prefill in flight there), by whether the pick would have been another without predictions (changed)."),
		pinIgnored: counter("kvroute_data_parallel_pin_ignored_total",
			"Data-parallel replicas this pod found ignoring the X-data-parallel-rank header (pinned responses served none of the cache the pinned engine held), by replica; each is then routed as one replica, fleet-wide."),
	}
	return m, errors.Join(errs...)
}

func label(k, v string) metric.MeasurementOption {
	return metric.WithAttributes(attribute.String(k, v))
}

// observe records one decision; took is the router's time, tokenize how
// long its prompt took to resolve (negative: it was not resolved again, a
// failover's decision).
func (m *metrics) observe(ctx context.Context, d router.Decision, p prompt.Result, took, tokenize time.Duration) {
	m.decisions.Add(ctx, 1, metric.WithAttributes(attribute.String("policy", string(d.Policy)), attribute.String("degraded", strconv.FormatBool(d.Degraded))))
	m.tokenization.Add(ctx, 1, label("source", string(p.Source)))
	if p.Blind != "" {
		m.blind.Add(ctx, 1, label("reason", p.Blind))
		m.degraded.Add(ctx, 1, label("reason", p.Blind))
	}
	if d.Degraded {
		m.degraded.Add(ctx, 1, label("reason", ReasonStoreUnavailable))
	}
	m.byReplica.Add(ctx, 1, label("replica", d.Replica.ID))
	if d.PredictionCounted {
		m.predicted.Add(ctx, 1, label("changed", strconv.FormatBool(d.PredictionChanged)))
	}
	m.latency.Record(ctx, took.Seconds())
	if d.PromptBlocks > 0 {
		m.matched.Record(ctx, float64(min(d.Matched, d.PromptBlocks))/float64(d.PromptBlocks))
	}
	for _, st := range [...]struct {
		opt metric.MeasurementOption
		d   time.Duration
	}{
		{stageTokenize, tokenize}, {stageRegistry, d.Stages.Registry}, {stageKeying, d.Stages.Keying},
		{stageLookup, d.Stages.Lookup}, {stageScoring, d.Stages.Scoring}, {stageReserve, d.Stages.Reserve},
	} {
		if st.d >= 0 {
			m.stage.Record(ctx, st.d.Seconds(), st.opt)
		}
	}
}

// The stage label values, built once: six histogram records a decision.
var (
	stageTokenize = label("stage", "tokenize")
	stageRegistry = label("stage", "registry")
	stageKeying   = label("stage", "keying")
	stageLookup   = label("stage", "lookup")
	stageScoring  = label("stage", "scoring")
	stageReserve  = label("stage", "reserve")
)

// apiError counts one error answer by its code.
func (m *metrics) apiError(ctx context.Context, code string) {
	m.errors.Add(ctx, 1, label("code", code))
}

// served records a proxied response's cached tokens against the belief.
func (m *metrics) served(ctx context.Context, replica string, believed int, u usage) {
	rep := label("replica", replica)
	if !u.Reported {
		m.unreported.Add(ctx, 1, rep)
		return
	}
	m.compared.Add(ctx, 1, rep)
	m.believed.Add(ctx, int64(believed), rep)
	m.servedTok.Add(ctx, int64(u.Cached), rep)
	if believed > u.Cached {
		m.phantom.Add(ctx, 1, rep)
	}
}

// observeRegistry reports the registry's replicas by model and health
// at scrape time, from the registry itself (bounded by a short timeout; a
// store that does not answer leaves the series out of that scrape).
func observeRegistry(mt metric.Meter, reg Registry) error {
	_, err := mt.Int64ObservableGauge("kvroute_registry_replicas",
		metric.WithDescription("Registered replicas, by model and health (healthy, unhealthy, or unknown: not probed yet)."),
		metric.WithInt64Callback(func(ctx context.Context, o metric.Int64Observer) error {
			ctx, cancel := context.WithTimeout(ctx, time.Second)
			defer cancel()
			reps, err := reg.ListReplicas(ctx)
			if err != nil {
				return nil
			}
			type key struct{ model, health string }
			n := map[key]int64{}
			for _, r := range reps {
				h := string(r.Health)
				if h == "" {
					h = "unknown"
				}
				n[key{r.Model, h}]++
			}
			for k, v := range n {
				o.Observe(v, metric.WithAttributes(attribute.String("model", k.model), attribute.String("health", k.health)))
			}
			return nil
		}))
	return err
}
