package prompt

import (
	"context"
	"errors"
	"strings"
	"sync"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"

	"github.com/kvroute/kvroute/tokenizer"
)

// meterName is the instrumentation scope of the front door's instruments.
const meterName = "github.com/kvroute/kvroute/prompt"

// metrics are the front door's instruments, made through the
// OpenTelemetry metrics API; the wiring's meter provider exports them on
// /metrics under the names, labels and help texts they had as
// Prometheus client collectors.
type metrics struct {
	prompts     counterVec
	blind       counterVec
	shadow      counterVec
	remoteCache counterVec
	// forwardChecks counts the comparisons that verify a local
	// tokenizer before its ids are forwarded (verify.go).
	forwardChecks counterVec
}

func newMetrics(mp metric.MeterProvider, r *Resolver) (*metrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	mt := mp.Meter(meterName)
	var errs []error
	cv := func(name, help string, labels ...string) counterVec {
		c, err := mt.Int64Counter(name, metric.WithDescription(help))
		errs = append(errs, err)
		return counterVec{c: c, labels: labels, series: &sync.Map{}}
	}
	m := &metrics{
		prompts:     cv("kvroute_prompts_total", "Prompts resolved to token ids, by model and source (given, local, remote, none).", "model", "source"),
		blind:       cv("kvroute_prompts_cache_blind_total", "Prompts that could not be tokenized, so their decisions were cache-blind, by model and reason.", "model", "reason"),
		shadow:      cv("kvroute_tokenizer_shadow_total", "Locally tokenized prompts also tokenized by a replica, by model and result (match, mismatch, error, skipped).", "model", "result"),
		remoteCache: cv("kvroute_remote_tokenize_cache_total", "Lookups of the remote-tokenization cache, by result (hit, miss).", "result"),
		forwardChecks: cv("kvroute_token_forwarding_checks_total",
			"Local tokenizations compared with a replica's before the model's token ids are forwarded, by model and result (match, mismatch, error); a mismatch stops forwarding.", "model", "result"),
	}
	errs = append(errs, observeCaches(mt, r), observeForwarding(mt, r))
	return m, errors.Join(errs...)
}

// counterVec is a counter with its label names; WithLabelValues binds
// their values in order. Each series' attribute set is built once, not
// on every prompt.
type counterVec struct {
	c      metric.Int64Counter
	labels []string
	series *sync.Map // values joined by NUL -> counter
}

// counter is one series of a counterVec. It records without a request's
// context: these counts carry no exemplars.
type counter struct {
	c   metric.Int64Counter
	opt metric.AddOption
}

func (v counterVec) WithLabelValues(values ...string) counter {
	key := strings.Join(values, "\x00")
	if c, ok := v.series.Load(key); ok {
		return c.(counter)
	}
	kv := make([]attribute.KeyValue, len(v.labels))
	for i, l := range v.labels {
		kv[i] = attribute.String(l, values[i])
	}
	c := counter{c: v.c, opt: metric.WithAttributes(kv...)}
	v.series.Store(key, c)
	return c
}

func (c counter) Inc() { c.c.Add(context.Background(), 1, c.opt) }

// observeCaches exports the local tokenization caches' counters, read
// when scraped: the caches keep their own counts.
func observeCaches(mt metric.Meter, r *Resolver) error {
	hits, err1 := mt.Int64ObservableCounter("kvroute_tokenizer_cache_hits_total", metric.WithDescription("Text segments answered from the tokenization cache."))
	misses, err2 := mt.Int64ObservableCounter("kvroute_tokenizer_cache_misses_total", metric.WithDescription("Text segments encoded and stored in the tokenization cache."))
	evictions, err3 := mt.Int64ObservableCounter("kvroute_tokenizer_cache_evictions_total", metric.WithDescription("Entries evicted from the tokenization cache to stay within its budget."))
	bytes, err4 := mt.Int64ObservableGauge("kvroute_tokenizer_cache_bytes", metric.WithDescription("Approximate bytes held by the tokenization cache."))
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return err
	}
	_, err := mt.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for name, m := range r.cfg.Models {
			tc, ok := m.Encoder.(*tokenizer.Cache)
			if !ok {
				continue
			}
			st := tc.Stats()
			model := metric.WithAttributes(attribute.String("model", name))
			o.ObserveInt64(hits, int64(st.Hits), model)
			o.ObserveInt64(misses, int64(st.Misses), model)
			o.ObserveInt64(evictions, int64(st.Evictions), model)
			o.ObserveInt64(bytes, int64(st.Bytes), model)
		}
		return nil
	}, hits, misses, evictions, bytes)
	return err
}

// observeForwarding exports each local model's token-forwarding state.
func observeForwarding(mt metric.Meter, r *Resolver) error {
	g, err := mt.Int64ObservableGauge("kvroute_token_forwarding",
		metric.WithDescription("Whether a local model's text prompts are forwarded as kvroute's token ids: 1 forwarding, 0 verifying its tokenizer against a replica's, -1 stopped after a mismatch."))
	if err != nil {
		return err
	}
	_, err = mt.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		for name := range r.cfg.Models {
			o.ObserveInt64(g, r.forwardingState(name), metric.WithAttributes(attribute.String("model", name)))
		}
		return nil
	}, g)
	return err
}
