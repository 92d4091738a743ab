package ingestor

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the ingestor's Prometheus collectors. They say whether the
// index can be trusted: gaps, replays, resets and orphans are the ways it
// drifts from what the replicas really hold.
type Metrics struct {
	batches         *prometheus.CounterVec
	stored          prometheus.Counter
	removed         prometheus.Counter
	unknownRemovals prometheus.Counter
	gaps            prometheus.Counter
	duplicates      prometheus.Counter
	replays         *prometheus.CounterVec
	replayedBatches prometheus.Counter
	resets          *prometheus.CounterVec
	clears          prometheus.Counter
	decodeErrors    *prometheus.CounterVec
	orphans         prometheus.Counter
	skipped         *prometheus.CounterVec
	lag             prometheus.Histogram
	stalled         *prometheus.GaugeVec
	dropped         prometheus.Counter
	probes          *prometheus.CounterVec
	scrapes         *prometheus.CounterVec
	purges          prometheus.Counter
	owned           prometheus.Gauge
	swept           prometheus.Counter
	// Per replica: what an operator alerts on ("no events applied for N s
	// while traffic flows", the most common silent failure of an index).
	replicaBatches *prometheus.CounterVec
	replicaApplied *prometheus.GaugeVec
}

// NewMetrics returns unregistered collectors (see Register).
func NewMetrics() *Metrics {
	const ns, sub = "kvroute", "ingest"
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help})
	}
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: name, Help: help}, labels)
	}
	return &Metrics{
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
		lag: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: sub, Name: "apply_lag_seconds",
			Help:    "Time from a batch's engine timestamp to its application in the store.",
			Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30},
		}),
		stalled: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "stream_stalled",
			Help: "1 while a replica's event stream has been silent longer than the stall timeout.",
		}, []string{"replica"}),
		dropped: c("dropped_messages_total", "Messages dropped because a replica's queue was full (bind mode)."),
		probes:  cv("health_probes_total", "Health probes by result (healthy, unhealthy).", "result"),
		scrapes: cv("metric_scrapes_total", "Metrics scrapes by result (ok, error).", "result"),
		purges:  c("purges_total", "Replicas purged after a grace period of unhealth or deletion."),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "owned_replicas",
			Help: "Replicas this ingestor holds the ownership lease of.",
		}),
		swept:          c("swept_leases_total", "Expired load leases released by the sweeper."),
		replicaBatches: cv("replica_batches_applied_total", "Event batches applied to the index, by replica.", "replica"),
		replicaApplied: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: ns, Subsystem: sub, Name: "replica_last_applied_timestamp_seconds",
			Help: "When a batch of the replica's events was last applied (Unix seconds): alert when it falls behind while the replica serves traffic.",
		}, []string{"replica"}),
	}
}

// Register registers every collector on reg.
func (m *Metrics) Register(reg prometheus.Registerer) error {
	var errs []error
	for _, c := range []prometheus.Collector{
		m.batches, m.stored, m.removed, m.unknownRemovals, m.gaps, m.duplicates, m.replays,
		m.replayedBatches, m.resets, m.clears, m.decodeErrors, m.orphans, m.skipped, m.lag,
		m.stalled, m.dropped, m.probes, m.scrapes, m.purges, m.owned, m.swept,
		m.replicaBatches, m.replicaApplied,
	} {
		errs = append(errs, reg.Register(c))
	}
	return errors.Join(errs...)
}
