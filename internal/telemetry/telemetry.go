// Package telemetry builds kvroute's OpenTelemetry SDK from the standard
// OTEL_* environment variables: a tracer provider exporting over OTLP when
// an endpoint is configured (a no-op one otherwise, so that an untraced
// pod pays nothing beyond the API's no-op calls), a meter provider whose
// Prometheus exporter serves every package's metrics on the pod's existing
// /metrics under the names operators already scrape, the W3C propagators,
// and a slog handler that stamps log lines with their trace. It is the
// only package that imports the SDK and the exporters: api, router and
// store see the OpenTelemetry API alone.
package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/otlptranslator"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracegrpc"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Options say what Setup builds besides what the environment says.
type Options struct {
	// ServiceName is the default service.name ("kvroute-serve",
	// "kvroute-ingest"); OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES
	// win over it.
	ServiceName string
	// Registerer receives the Prometheus exporter of the meter provider,
	// so that every package's OpenTelemetry instruments appear on the
	// same /metrics as the Go and process collectors registered there.
	Registerer prometheus.Registerer
	// Getenv reads the environment; nil means os.Getenv. The OTLP
	// exporters themselves read the process environment (endpoint,
	// headers, TLS, timeouts), as their packages document.
	Getenv func(string) string
}

// Telemetry is what the wiring hands to api, router and store.
type Telemetry struct {
	TracerProvider trace.TracerProvider
	MeterProvider  metric.MeterProvider
	Propagator     propagation.TextMapPropagator
	// Tracing is true when spans are exported; false means
	// TracerProvider is the no-op one.
	Tracing bool
	// Exporter describes the trace export for the start-up log line
	// ("none", or the protocol and endpoint).
	Exporter string
	shutdown []func(context.Context) error
}

// Setup builds the providers the environment describes:
//
//   - traces are exported over OTLP when OTEL_TRACES_EXPORTER is "otlp",
//     or is unset and OTEL_EXPORTER_OTLP_ENDPOINT or
//     OTEL_EXPORTER_OTLP_TRACES_ENDPOINT is set; OTEL_SDK_DISABLED=true
//     or OTEL_TRACES_EXPORTER=none turn them off. The protocol is
//     OTEL_EXPORTER_OTLP_TRACES_PROTOCOL or OTEL_EXPORTER_OTLP_PROTOCOL:
//     http/protobuf (the default) or grpc. Spans go through a batch
//     processor (OTEL_BSP_*, batch.go); the sampler is OTEL_TRACES_SAMPLER and
//     OTEL_TRACES_SAMPLER_ARG (the SDK's default: parentbased_always_on).
//   - the resource is service.name (opt.ServiceName unless
//     OTEL_SERVICE_NAME), OTEL_RESOURCE_ATTRIBUTES and the SDK's own.
//   - metrics always go to opt.Registerer through the Prometheus exporter,
//     named exactly as the instruments are (no unit or _total suffixes
//     added, no otel_scope labels, no target_info): /metrics is the
//     operators' contract and OTEL_SDK_DISABLED does not remove it.
//   - the propagators are OTEL_PROPAGATORS (tracecontext, baggage, none),
//     by default tracecontext and baggage.
//
// Shutdown flushes and stops what Setup started.
func Setup(ctx context.Context, opt Options) (*Telemetry, error) {
	getenv := opt.Getenv
	if getenv == nil {
		getenv = os.Getenv
	}
	t := &Telemetry{TracerProvider: noop.NewTracerProvider(), Exporter: "none"}
	var err error
	if t.Propagator, err = propagators(getenv("OTEL_PROPAGATORS")); err != nil {
		return nil, err
	}
	if opt.Registerer != nil {
		mp, err := NewMeterProvider(opt.Registerer)
		if err != nil {
			return nil, err
		}
		t.MeterProvider = mp
		t.shutdown = append(t.shutdown, mp.Shutdown)
	} else {
		t.MeterProvider = metricnoop.NewMeterProvider()
	}
	protocol, endpoint, on, err := traceExport(getenv)
	if err != nil || !on {
		return t, err
	}
	batch, err := batchFromEnv(getenv)
	if err != nil {
		return nil, err
	}
	var exp sdktrace.SpanExporter
	switch protocol {
	case "http/protobuf":
		exp, err = otlptracehttp.New(ctx)
	case "grpc":
		exp, err = otlptracegrpc.New(ctx)
	default:
		err = fmt.Errorf("OTEL_EXPORTER_OTLP_PROTOCOL=%q: kvroute exports traces over http/protobuf or grpc", protocol)
	}
	if err != nil {
		return nil, fmt.Errorf("telemetry: trace exporter: %w", err)
	}
	res, err := newResource(ctx, opt.ServiceName)
	if err != nil {
		_ = exp.Shutdown(ctx)
		return nil, err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(newSpanBatcher(exp, batch)), sdktrace.WithResource(res))
	t.TracerProvider, t.Tracing = tp, true
	t.Exporter = protocol + " " + endpoint
	t.shutdown = append(t.shutdown, tp.Shutdown)
	return t, nil
}

// Shutdown flushes the spans still batched and stops the providers.
func (t *Telemetry) Shutdown(ctx context.Context) error {
	var errs []error
	for i := len(t.shutdown) - 1; i >= 0; i-- {
		errs = append(errs, t.shutdown[i](ctx))
	}
	t.shutdown = nil
	return errors.Join(errs...)
}

// traceExport reads whether and how traces are exported.
func traceExport(getenv func(string) string) (protocol, endpoint string, on bool, _ error) {
	if strings.EqualFold(strings.TrimSpace(getenv("OTEL_SDK_DISABLED")), "true") {
		return "", "", false, nil
	}
	endpoint = getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
	if endpoint == "" {
		endpoint = getenv("OTEL_EXPORTER_OTLP_ENDPOINT")
	}
	switch e := strings.TrimSpace(getenv("OTEL_TRACES_EXPORTER")); e {
	case "none":
		return "", "", false, nil
	case "":
		if endpoint == "" {
			return "", "", false, nil
		}
	case "otlp":
	default:
		return "", "", false, fmt.Errorf("OTEL_TRACES_EXPORTER=%q: kvroute exports traces with otlp (or none)", e)
	}
	protocol = getenv("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
	if protocol == "" {
		protocol = getenv("OTEL_EXPORTER_OTLP_PROTOCOL")
	}
	if protocol == "" {
		protocol = "http/protobuf"
	}
	if endpoint == "" {
		endpoint = "(the exporter's default)"
	}
	return protocol, endpoint, true, nil
}

// propagators is OTEL_PROPAGATORS as a composite propagator.
func propagators(v string) (propagation.TextMapPropagator, error) {
	if strings.TrimSpace(v) == "" {
		v = "tracecontext,baggage"
	}
	var ps []propagation.TextMapPropagator
	for name := range strings.SplitSeq(v, ",") {
		switch name = strings.TrimSpace(name); name {
		case "tracecontext":
			ps = append(ps, propagation.TraceContext{})
		case "baggage":
			ps = append(ps, propagation.Baggage{})
		case "none":
			return propagation.NewCompositeTextMapPropagator(), nil
		default:
			return nil, fmt.Errorf("OTEL_PROPAGATORS: %q is not supported (tracecontext, baggage, none)", name)
		}
	}
	return propagation.NewCompositeTextMapPropagator(ps...), nil
}

// newResource describes this process: the default service name first,
// so that OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES override it.
func newResource(ctx context.Context, service string) (*resource.Resource, error) {
	if service == "" {
		service = "kvroute"
	}
	res, err := resource.New(ctx,
		resource.WithAttributes(attribute.String("service.name", service)),
		resource.WithTelemetrySDK(),
		resource.WithFromEnv(),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry: resource: %w", err)
	}
	return res, nil
}

// NewMeterProvider is a meter provider whose instruments are served by
// reg's /metrics exactly as named: UnderscoreEscapingWithoutSuffixes
// keeps kvroute_decisions_total and kvroute_decision_duration_seconds
// as they are (the instruments carry the Prometheus names, suffixes
// included), and scope labels and target_info are left out so that the
// series and their labels are those client_golang served before.
func NewMeterProvider(reg prometheus.Registerer) (*sdkmetric.MeterProvider, error) {
	exp, err := otelprom.New(
		otelprom.WithRegisterer(reg),
		otelprom.WithTranslationStrategy(otlptranslator.UnderscoreEscapingWithoutSuffixes),
		otelprom.WithoutScopeInfo(),
		otelprom.WithoutTargetInfo(),
	)
	if err != nil {
		return nil, fmt.Errorf("telemetry: prometheus exporter: %w", err)
	}
	return sdkmetric.NewMeterProvider(sdkmetric.WithReader(exp)), nil
}
