package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"go.opentelemetry.io/otel/metric"

	"github.com/kvroute/kvroute/internal/telemetry"
	"github.com/kvroute/kvroute/store"
)

// telemetryShutdownTimeout bounds the flush of batched spans at Stop: an
// unreachable collector must not hold a pod's exit.
const telemetryShutdownTimeout = 5 * time.Second

// setupTelemetry builds the process's OpenTelemetry SDK from the OTEL_*
// environment (internal/telemetry.Setup): the metrics registry /metrics
// serves, with the runtime collectors and the OpenTelemetry exporter of
// every package's metrics in it; traces exported when an OTLP endpoint is
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

// meterName is the instrumentation scope of the wiring's own instruments.
const meterName = "github.com/kvroute/kvroute/internal/app"

// observeRouter reports, read when scraped, whether the router reaches
// its store and how many progress reports wait for it.
func (a *App) observeRouter() error {
	mt := a.tel.MeterProvider.Meter(meterName)
	up, err1 := mt.Int64ObservableGauge("kvroute_store_up",
		metric.WithDescription("1 while the state store answers, 0 while decisions skip it (degraded); reported apart from readiness."))
	queued, err2 := mt.Int64ObservableGauge("kvroute_progress_reports_queued",
		metric.WithDescription("First-token and release reports waiting for the state store, retried in the background."))
	if err := errors.Join(err1, err2); err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	_, err := mt.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		var v int64
		if a.Router.StoreUp() {
			v = 1
		}
		o.ObserveInt64(up, v)
		o.ObserveInt64(queued, int64(a.Router.Queued()))
		return nil
	}, up, queued)
	if err != nil {
		return fmt.Errorf("metrics: %w", err)
	}
	return nil
}

// countStoreErrors counts the store's failed Redis commands on the App's
// meter provider (kvroute_redis_errors_total).
// It counts the predicted entries this pod's bookings write and end too
// (kvroute_predictions_total).
func (a *App) countStoreErrors() error {
	return errors.Join(a.Store.CountErrors(a.tel.MeterProvider), a.Store.CountPredictions(a.tel.MeterProvider))
}

// shutdownTelemetry flushes the spans still batched.
func (a *App) shutdownTelemetry() error {
	if a.tel == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), telemetryShutdownTimeout)
	defer cancel()
	return a.tel.Shutdown(ctx)
}

// ingestTelemetry is the ingestor's: a meter provider exported into reg,
// for the ingestor's metrics, with the store's failed Redis commands
// counted on it. It exports no traces: an ingestor's work is background
// work no request waits on, and the store's Redis spans are made only
// under a request's span.
func ingestTelemetry(st *store.Store, reg prometheus.Registerer) (metric.MeterProvider, error) {
	mp, err := telemetry.NewMeterProvider(reg)
	if err != nil {
		return nil, err
	}
	return mp, errors.Join(st.CountErrors(mp), st.CountPredictions(mp))
}
