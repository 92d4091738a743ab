package ingestor

import (
	"context"
	"errors"
	"math"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/metric/noop"
)

// meterName is the instrumentation scope of the ingestor's instruments.
const meterName = "github.com/kvroute/kvroute/ingestor"

// Metrics are the ingestor's instruments, made through the OpenTelemetry
// metrics API; the wiring's meter provider exports them on /metrics under
// exactly the names, labels and help texts they had as Prometheus
// client collectors. They say whether the index can be trusted: gaps, replays,
// resets and orphans are the ways it drifts from what the replicas really
// hold.
type Metrics struct {
	batches         counterVec
	stored          counter
	removed         counter
	unknownRemovals counter
	gaps            counter
	duplicates      counter
	replays         counterVec
	replayedBatches counter
	resets          counterVec
	clears          counter
	decodeErrors    counterVec
	orphans         counter
	skipped         counterVec
	lag             histogram
	stalled         *gaugeVec
	dropped         counter
	probes          counterVec
	scrapes         counterVec
	purges          counter
	owned           *gauge
	swept           counter
	fenced          counter
	// Per replica: what an operator alerts on ("no events applied for N s
	// while traffic flows", the most common silent failure of an index).
	replicaBatches counterVec
	replicaApplied *gaugeVec
}

// lagBounds are the apply-lag histogram's buckets, as the Prometheus client
// histogram had them.
var lagBounds = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30}

// NewMetrics makes the ingestor's instruments on mp's meter. A nil mp
// means a no-op provider: the ingestor records into nothing, for a caller
// (a test, a benchmark) that does not read them.
func NewMetrics(mp metric.MeterProvider) (*Metrics, error) {
	if mp == nil {
		mp = noop.NewMeterProvider()
	}
	mt := mp.Meter(meterName)
	const prefix = "kvroute_ingest_"
	var errs []error
	c := func(name, help string) counter {
		fc, err := mt.Float64Counter(prefix+name, metric.WithDescription(help))
		errs = append(errs, err)
		// The Prometheus client served an unlabelled counter at 0 from the start;
		// a first measurement of 0 keeps it served before its first event.
		c := counter{c: fc}
		c.Add(0)
		return c
	}
	cv := func(name, help, label string) counterVec {
		fc, err := mt.Float64Counter(prefix+name, metric.WithDescription(help))
		errs = append(errs, err)
		return counterVec{c: fc, label: label, series: &sync.Map{}}
	}
	gv := func(name, help, label string) *gaugeVec {
		g := &gaugeVec{label: label, v: map[string]float64{}}
		_, err := mt.Float64ObservableGauge(prefix+name, metric.WithDescription(help), metric.WithFloat64Callback(g.observe))
		errs = append(errs, err)
		return g
	}
	m := &Metrics{
		batches:         cv("batches_total", "Event batches handed to the store, by result (applied, not_applied).", "result"),
		stored:          c("blocks_stored_total", "Block references added to the index."),
		removed:         c("blocks_removed_total", "Block references dropped from the index."),
		unknownRemovals: c("unknown_removals_total", "Removals of blocks the index did not hold for the replica."),
		gaps:            c("gaps_total", "Forward jumps of a replica's seq (batches lost) and mid-stream joins."),
		duplicates:      c("duplicate_batches_total", "Live batches skipped because a replay had already applied them."),
		replays:         cv("replays_total", "Replay attempts by result (ok, short, error, unavailable).", "result"),
		replayedBatches: c("replayed_batches_total", "Batches received over replay sockets."),
		resets:          cv("resets_total", "Replica entries cleared by the ingestor, by reason (restart, gap, short_replay, store_lost).", "reason"),
		clears:          c("clears_total", "AllBlocksCleared events applied."),
		decodeErrors:    cv("decode_errors_total", "Messages rejected whole, by reason.", "reason"),
		orphans:         c("orphans_total", "BlockStored events skipped because their parent hash was unknown."),
		skipped:         cv("skipped_events_total", "Events (or offload blocks) skipped, by reason.", "reason"),
		stalled:         gv("stream_stalled", "1 while a replica's event stream has been silent longer than the stall timeout.", "replica"),
		dropped:         c("dropped_messages_total", "Messages dropped because a replica's queue was full (bind mode)."),
		probes:          cv("health_probes_total", "Health probes by result (healthy, unhealthy).", "result"),
		scrapes:         cv("metric_scrapes_total", "Metrics scrapes by result (ok, error).", "result"),
		purges:          c("purges_total", "Replicas purged after a grace period of unhealth or deletion."),
		owned:           &gauge{},
		swept:           c("swept_leases_total", "Expired load leases released by the sweeper."),
		fenced: c("fenced_total",
			"Times the store refused this ingestor's writes to a replica because another ingestor had claimed it (a lease handover)."),
		replicaBatches: cv("replica_batches_applied_total", "Event batches applied to the index, by replica.", "replica"),
		replicaApplied: gv("replica_last_applied_timestamp_seconds",
			"When a batch of the replica's events was last applied (Unix seconds): alert when it falls behind while the replica serves traffic.", "replica"),
	}
	lag, err := mt.Float64Histogram(prefix+"apply_lag_seconds",
		metric.WithDescription("Time from a batch's engine timestamp to its application in the store."),
		metric.WithExplicitBucketBoundaries(lagBounds...))
	m.lag = histogram{lag}
	errs = append(errs, err)
	_, err = mt.Float64ObservableGauge(prefix+"owned_replicas", metric.WithDescription("Replicas this ingestor holds the ownership lease of."),
		metric.WithFloat64Callback(m.owned.observe))
	errs = append(errs, err)
	return m, errors.Join(errs...)
}

// The instruments below are recorded without a request's context: the
// ingestor's work is background work no trace is on, and the meter takes
// no exemplars from it.

// counter is a counter with its label, if any, bound.
type counter struct {
	c    metric.Float64Counter
	opts []metric.AddOption
}

func (c counter) Inc()          { c.Add(1) }
func (c counter) Add(v float64) { c.c.Add(context.Background(), v, c.opts...) }

// counterVec is a counter with one label. Each value's attribute set is
// built once (series: the values are few, results and replica ids), not
// on every batch.
type counterVec struct {
	c      metric.Float64Counter
	label  string
	series *sync.Map // value -> counter
}

func (v counterVec) WithLabelValues(value string) counter {
	if c, ok := v.series.Load(value); ok {
		return c.(counter)
	}
	c := counter{c: v.c, opts: []metric.AddOption{metric.WithAttributes(attribute.String(v.label, value))}}
	v.series.Store(value, c)
	return c
}

type histogram struct{ h metric.Float64Histogram }

func (h histogram) Observe(v float64) { h.h.Record(context.Background(), v) }

// gauge is a value read when scraped; its zero value reads 0.
type gauge struct{ bits atomic.Uint64 }

func (g *gauge) Set(v float64) { g.bits.Store(math.Float64bits(v)) }

func (g *gauge) observe(_ context.Context, o metric.Float64Observer) error {
	o.Observe(math.Float64frombits(g.bits.Load()))
	return nil
}

// gaugeVec is a gauge with one label whose series can be deleted (a
// replica no longer followed): it holds the values and the meter reads
// them when scraped, since a synchronous OpenTelemetry gauge cannot
// forget a series.
type gaugeVec struct {
	label string
	mu    sync.Mutex
	v     map[string]float64
}

// gaugeChild is one series of a gaugeVec.
type gaugeChild struct {
	g     *gaugeVec
	value string
}

func (g *gaugeVec) WithLabelValues(value string) gaugeChild { return gaugeChild{g, value} }

func (c gaugeChild) Set(v float64) {
	c.g.mu.Lock()
	c.g.v[c.value] = v
	c.g.mu.Unlock()
}

func (g *gaugeVec) DeleteLabelValues(value string) {
	g.mu.Lock()
	delete(g.v, value)
	g.mu.Unlock()
}

func (g *gaugeVec) observe(_ context.Context, o metric.Float64Observer) error {
	g.mu.Lock()
	defer g.mu.Unlock()
	for value, v := range g.v {
		o.Observe(v, metric.WithAttributes(attribute.String(g.label, value)))
	}
	return nil
}
