package app

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/dialer"
	"github.com/kvroute/kvroute/discovery"
)

// DiscoverConfig is what an ingestor discovers its fleet with (the
// --discover-* flags): the sources, and how the reconciler treats what
// they report.
type DiscoverConfig struct {
	// Sources are the fleets to follow (DNS names, Kubernetes services);
	// none means no discovery: replicas are registered by hand only.
	Sources []discovery.Source
	// Interval is how often each source's last set is reconciled again
	// (failed model lookups retried, gone replicas purged); zero means 5s.
	Interval time.Duration
	// Grace is how long a gone replica is kept before it is purged; zero
	// means 30s.
	Grace time.Duration
	// Owner names this process in the sources' leases; empty means the
	// ingestor's owner.
	Owner string
}

// Enabled reports whether any source is configured.
func (c DiscoverConfig) Enabled() bool { return len(c.Sources) > 0 }

// Discover is the embedded mode's discovery: the reconciler over the
// app's store, dialling endpoints through the app's Dialer, its metrics
// on the app's /metrics. Routing depends on it like on the ingestor: if
// it ends, the process stops.
func Discover(c DiscoverConfig) Task {
	return Task{Name: "discovery", Run: func(ctx context.Context, a *App) error {
		if c.Owner == "" {
			c.Owner = "embedded"
		}
		return runDiscovery(ctx, c, a.Store, a.Dialer, a.cfg.ReplicaPolicy, a.tel.MeterProvider, a.log)
	}}
}

// runDiscovery builds the reconciler and runs it until ctx ends.
func runDiscovery(ctx context.Context, c DiscoverConfig, reg discovery.Registry, d *dialer.Dialer, p kvroute.AddressPolicy,
	mp metric.MeterProvider, log *slog.Logger) error {
	r, err := discovery.New(discovery.Config{
		Registry: reg, Sources: c.Sources, Owner: c.Owner, Interval: c.Interval, Grace: c.Grace,
		Dialer: d, Policy: p, MeterProvider: mp, Logger: log,
	})
	if err != nil {
		return err
	}
	names := make([]string, len(c.Sources))
	for i, s := range c.Sources {
		names[i] = s.Name()
	}
	log.Info("discovering replicas", "sources", names, "interval", c.Interval, "grace", c.Grace)
	if err := r.Run(ctx); err != nil {
		return fmt.Errorf("discovery: %w", err)
	}
	return nil
}
