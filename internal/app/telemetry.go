package app

import (
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/kvroute/kvroute/internal/telemetry"
	"github.com/kvroute/kvroute/store"
)

// telemetryShutdownTimeout bounds the flush of batched spans at Stop: an
// unreachable collector must not hold a pod's exit.
const telemetryShutdownTimeout = 5 * time.Second

// setupTelemetry builds the process's OpenTelemetry SDK from the OTEL_*
// environment (internal/telemetry.Setup): the metrics registry /metrics
// serves, with the runtime collectors and the OpenTelemetry exporter of
// the decision metrics in it; traces exported when an OTLP endpoint is
// configured; and a logger whose lines carry their trace. Each App has its
// own providers (none is made global), so that in-process pods in one
// test binary each trace and count their own.
func (a *App) setupTelemetry(ctx context.Context) error {
	a.log = slog.New(telemetry.LogHandler(a.log.Handler()))
	a.Registry = prometheus.NewRegistry()
	a.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	tel, err := telemetry.Setup(ctx, telemetry.Options{ServiceName: "kvroute", Registerer: a.Registry})
	if err != nil {
		return err
	}
	a.tel = tel
	if tel.Tracing {
		a.log.Info("exporting traces", "exporter", tel.Exporter)
	}
	return nil
}

// countStoreErrors counts the store's failed Redis commands on the App's
// meter provider (kvroute_redis_errors_total).
func (a *App) countStoreErrors() error { return a.Store.CountErrors(a.tel.MeterProvider) }

// shutdownTelemetry flushes the spans still batched.
func (a *App) shutdownTelemetry() error {
	if a.tel == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), telemetryShutdownTimeout)
	defer cancel()
	return a.tel.Shutdown(ctx)
}

// ingestTelemetry is the ingestor's: its failed Redis commands counted on
// reg, and a logger whose lines carry their trace. It exports no traces:
// an ingestor's work is background work no request waits on, and the
// store's Redis spans are made only under a request's span.
func ingestTelemetry(st *store.Store, reg prometheus.Registerer) error {
	mp, err := telemetry.NewMeterProvider(reg)
	if err != nil {
		return err
	}
	return st.CountErrors(mp)
}
