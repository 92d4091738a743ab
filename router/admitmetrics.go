package router

import (
	"context"
	"errors"
	"strconv"
	"sync"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

const meterName = "github.com/kvroute/kvroute/router"

// maxTenantLabels bounds the tenants named in metric labels: a trusted
// tenant header could name any number, and each would be a new series.
// The rest are counted as "_other".
const maxTenantLabels = 64

// admitMetrics is admission's instruments: queue depth (the model's, read
// from the store at each beat, and this pod's waiters by band and
// tenant), wait time, admissions and sheds by reason, and dispatch
// latency (capacity freed to request told).
type admitMetrics struct {
	waitTime   metric.Float64Histogram
	admitted   metric.Int64Counter
	shedCount  metric.Int64Counter
	dispatch   metric.Float64Histogram
	queuedN    metric.Int64Counter
	waitersFor func() map[[3]string]int64

	mu      sync.Mutex
	depths  map[string]int64
	tenants map[string]bool
	// mean is each model's mean queue wait (an exponentially weighted
	// average), for Retry-After.
	mean map[string]time.Duration
}

var waitBounds = []float64{.001, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120}

func newAdmitMetrics(mp metric.MeterProvider, waiters func() map[[3]string]int64) (*admitMetrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	mt := mp.Meter(meterName)
	m := &admitMetrics{depths: map[string]int64{}, tenants: map[string]bool{}, mean: map[string]time.Duration{}, waitersFor: waiters}
	var errs []error
	add := func(err error) { errs = append(errs, err) }
	var err error
	m.waitTime, err = mt.Float64Histogram("kvroute_queue_wait_seconds",
		metric.WithDescription("Time requests waited in the admission queue, by model, priority, tenant and outcome (admitted, shed, gone)."),
		metric.WithExplicitBucketBoundaries(waitBounds...))
	add(err)
	m.dispatch, err = mt.Float64Histogram("kvroute_queue_dispatch_seconds",
		metric.WithDescription("Time from capacity freed (the queue's grant) to the queued request's pod told, by model."),
		metric.WithExplicitBucketBoundaries(waitBounds...))
	add(err)
	m.admitted, err = mt.Int64Counter("kvroute_admitted_total",
		metric.WithDescription("Requests admitted under admission, by model, priority and whether they queued first."))
	add(err)
	m.shedCount, err = mt.Int64Counter("kvroute_shed_total",
		metric.WithDescription("Requests admission refused, by model, priority and reason (queue_full, band_full, tenant_full, ttl, no_wait, no_replica, pod_limit; client_gone: the client left while it waited)."))
	add(err)
	m.queuedN, err = mt.Int64Counter("kvroute_queued_total",
		metric.WithDescription("Requests that found no replica with room and queued, by model and priority."))
	add(err)
	_, err = mt.Int64ObservableGauge("kvroute_queue_depth",
		metric.WithDescription("Requests queued for a model fleet-wide, as this pod's last beat read it from the store (the same figure as LLEN kvr:{m:<model>}:depth)."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			m.mu.Lock()
			defer m.mu.Unlock()
			for model, d := range m.depths {
				o.Observe(d, metric.WithAttributes(attribute.String("model", model)))
			}
			return nil
		}))
	add(err)
	_, err = mt.Int64ObservableGauge("kvroute_queue_waiting",
		metric.WithDescription("Queued requests this pod holds, by model, priority and tenant."),
		metric.WithInt64Callback(func(_ context.Context, o metric.Int64Observer) error {
			for k, n := range m.waitersFor() {
				o.Observe(n, metric.WithAttributes(attribute.String("model", k[0]), attribute.String("priority", k[1]), attribute.String("tenant", k[2])))
			}
			return nil
		}))
	add(err)
	return m, errors.Join(errs...)
}

// tenant is t as a label value: the first maxTenantLabels tenants seen by
// name, the rest "_other".
func (m *admitMetrics) tenant(t string) string {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.tenants[t] {
		return t
	}
	if len(m.tenants) < maxTenantLabels {
		m.tenants[t] = true
		return t
	}
	return "_other"
}

func (m *admitMetrics) attrs(req Request, more ...attribute.KeyValue) metric.MeasurementOption {
	return metric.WithAttributes(append([]attribute.KeyValue{attribute.String("model", req.Model),
		attribute.String("priority", strconv.Itoa(req.Priority)), attribute.String("tenant", m.tenant(req.Tenant))}, more...)...)
}

func (m *admitMetrics) queued(req Request) {
	m.queuedN.Add(context.Background(), 1, metric.WithAttributes(attribute.String("model", req.Model), attribute.String("priority", strconv.Itoa(req.Priority))))
}

// admittedAfter records an admission after waited in the queue (0: at
// once).
func (m *admitMetrics) admittedAfter(req Request, waited time.Duration) {
	ctx := context.Background()
	m.admitted.Add(ctx, 1, metric.WithAttributes(attribute.String("model", req.Model), attribute.String("priority", strconv.Itoa(req.Priority)),
		attribute.Bool("queued", waited > 0)))
	if waited <= 0 {
		return
	}
	m.waitTime.Record(ctx, waited.Seconds(), m.attrs(req, attribute.String("outcome", "admitted")))
	m.mu.Lock()
	prev, ok := m.mean[req.Model]
	if !ok {
		prev = waited
	}
	m.mean[req.Model] = (prev*7 + waited) / 8
	m.mu.Unlock()
}

func (m *admitMetrics) shed(req Request, reason string) {
	m.shedCount.Add(context.Background(), 1, metric.WithAttributes(attribute.String("model", req.Model),
		attribute.String("priority", strconv.Itoa(req.Priority)), attribute.String("reason", reason)))
}

func (m *admitMetrics) gone(req Request) {
	m.shed(req, "client_gone")
}

func (m *admitMetrics) dispatched(w *waiter, took time.Duration) {
	m.dispatch.Record(context.Background(), max(took, 0).Seconds(), metric.WithAttributes(attribute.String("model", w.model)))
}

func (m *admitMetrics) depth(model string, d int) {
	m.mu.Lock()
	m.depths[model] = int64(d)
	m.mu.Unlock()
}

// meanWait is the model's mean queue wait, a second when none is known.
func (m *admitMetrics) meanWait(model string) time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	if d, ok := m.mean[model]; ok {
		return d
	}
	return time.Second
}
