package discovery

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// meterName is the instrumentation scope of discovery's instruments.
const meterName = "github.com/kvroute/kvroute/discovery"

// metrics are discovery's instruments, each labelled with the source: how
// many endpoints it sees, and what the reconciler did with them. A fleet
// that churns shows in added and gone; a model lookup that keeps failing
// is an endpoint that never becomes a replica.
type metrics struct {
	endpoints metric.Int64Gauge
	added     metric.Int64Counter
	gone      metric.Int64Counter
	purged    metric.Int64Counter
	lookups   metric.Int64Counter
	skipped   metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider) (*metrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	mt := mp.Meter(meterName)
	var m metrics
	var e [6]error
	m.endpoints, e[0] = mt.Int64Gauge("kvroute_discovery_endpoints",
		metric.WithDescription("Endpoints the discovery source reported last."))
	m.added, e[1] = mt.Int64Counter("kvroute_discovery_replicas_added_total",
		metric.WithDescription("Replicas discovery registered: new endpoints, and gone ones that came back (their index reset)."))
	m.gone, e[2] = mt.Int64Counter("kvroute_discovery_replicas_gone_total",
		metric.WithDescription("Discovered replicas marked gone (not routed) because their source no longer reports them."))
	m.purged, e[3] = mt.Int64Counter("kvroute_discovery_replicas_purged_total",
		metric.WithDescription("Gone replicas deleted after the grace period, with their index, load and bookings."))
	m.lookups, e[4] = mt.Int64Counter("kvroute_discovery_model_lookups_failed_total",
		metric.WithDescription("Endpoints whose /v1/models could not be read; retried next interval, not registered until it is."))
	m.skipped, e[5] = mt.Int64Counter("kvroute_discovery_endpoints_skipped_total",
		metric.WithDescription("Endpoints not written, by reason: the id is another writer's replica (foreign), the address policy refuses it (refused), or it repeats an id (duplicate)."))
	if err := errors.Join(e[:]...); err != nil {
		return nil, fmt.Errorf("discovery: metrics: %w", err)
	}
	return &m, nil
}

func src(name string) metric.MeasurementOption {
	return metric.WithAttributes(attribute.String("source", name))
}

func (m *metrics) skip(ctx context.Context, source, reason string) {
	m.skipped.Add(ctx, 1, metric.WithAttributes(attribute.String("source", source), attribute.String("reason", reason)))
}

// zero records a first 0 on the source's counters, so that they are served
// (and alerts on them evaluate) before their first event.
func (m *metrics) zero(ctx context.Context, source string) {
	for _, c := range []metric.Int64Counter{m.added, m.gone, m.purged, m.lookups} {
		c.Add(ctx, 0, src(source))
	}
	for _, reason := range []string{"foreign", "refused", "duplicate"} {
		m.skipped.Add(ctx, 0, metric.WithAttributes(attribute.String("source", source), attribute.String("reason", reason)))
	}
}
