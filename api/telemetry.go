package api

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the API's spans.
const tracerName = "github.com/kvroute/kvroute/api"

// A request's trace (see README, "how to read a trace"):
//
//	POST /v1/chat/completions          server span, child of the caller's traceparent
//	├─ kvroute.decision                kvroute.replica, .model, .matched_blocks, .policy, …
//	│  ├─ kvroute.tokenize             the front door (prompt.Resolver)
//	│  ├─ kvroute.registry             the fleet (cached ≤ RegistryTTL, else HGETALL)
//	│  ├─ kvroute.keying               block keys
//	│  ├─ kvroute.lookup → evalsha lookup.lua
//	│  ├─ kvroute.scoring              router.Decide
//	│  └─ kvroute.reserve → evalsha reserve.lua   (again per lost race)
//	└─ kvroute.proxy                   the upstream round trip until the body ends;
//	                                   the replica gets this span as its traceparent
//
// Probes and /metrics are not traced: orchestrators call them every few
// seconds and their traces would bury the ones that matter.

// telemetry fills Config's providers' defaults: the global ones (no-ops
// unless the program sets them) and the W3C trace-context and baggage
// propagators, so that an incoming traceparent is honoured and passed on
// even when this pod does not trace.
func (c *Config) telemetry() {
	if c.TracerProvider == nil {
		c.TracerProvider = otel.GetTracerProvider()
	}
	if c.MeterProvider == nil {
		c.MeterProvider = otel.GetMeterProvider()
	}
	if c.Propagator == nil {
		c.Propagator = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
}

// untraced are the paths that get no span.
func untraced(path string) bool {
	switch path {
	case "/healthz", "/readyz", "/metrics":
		return true
	}
	return false
}

// accessLog starts the request's server span (the caller's traceparent
// its parent), writes a structured line for the requests Config.AccessLog
// says (accesslog.go) with the span's
// context (the log handler adds trace_id and span_id), and ends the span
// with the route and status. It wraps the writer with chi's
// WrapResponseWriter, which keeps http.Flusher (and Unwrap for
// http.ResponseController) so that proxied streams still flush.
func (s *Server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		ww := middleware.NewWrapResponseWriter(w, r.ProtoMajor)
		probe := untraced(r.URL.Path)
		span := trace.SpanFromContext(r.Context())
		if !probe {
			ctx := s.cfg.Propagator.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
			ctx, span = s.tracer.Start(ctx, r.Method, trace.WithSpanKind(trace.SpanKindServer),
				trace.WithAttributes(attribute.String("http.request.method", r.Method), attribute.String("url.path", r.URL.Path)))
			r = r.WithContext(ctx)
		}
		defer func() {
			status := ww.Status()
			if !probe {
				if span.IsRecording() {
					route := r.URL.Path
					if rc := chi.RouteContext(r.Context()); rc != nil && rc.RoutePattern() != "" {
						route = rc.RoutePattern()
					}
					span.SetName(r.Method + " " + route)
					span.SetAttributes(attribute.String("http.route", route), attribute.Int("http.response.status_code", status),
						attribute.String("kvroute.http_request_id", middleware.GetReqID(r.Context())))
					if status >= 500 {
						span.SetStatus(codes.Error, strconv.Itoa(status))
					}
				}
				span.End()
			}
			level, ok := s.accessLevel(status, probe)
			if !ok {
				return
			}
			s.log.LogAttrs(r.Context(), level, "http",
				slog.String("method", r.Method), slog.String("path", r.URL.Path),
				slog.Int("status", status), slog.Int("bytes", ww.BytesWritten()),
				slog.Duration("duration", time.Since(start)),
				slog.String("http_request_id", middleware.GetReqID(r.Context())),
				slog.String("remote", r.RemoteAddr))
		}()
		next.ServeHTTP(ww, r)
	})
}

// startDecision starts a decision's span; failover names the replica a
// proxied request is leaving ("" for a first decision).
func (s *Server) startDecision(ctx context.Context, model, failover string) (context.Context, trace.Span) {
	ctx, span := s.tracer.Start(ctx, "kvroute.decision")
	if span.IsRecording() {
		span.SetAttributes(attribute.String("kvroute.model", model))
		if failover != "" {
			span.SetAttributes(attribute.String("kvroute.failover_from", failover))
		}
	}
	return ctx, span
}

// endDecision puts the decision on its span (or the error) and ends it.
func endDecision(span trace.Span, k keyed, err error) {
	if span.IsRecording() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, err.Error())
		} else {
			span.SetAttributes(
				attribute.String("kvroute.replica", k.Replica.ID),
				attribute.String("kvroute.request_id", k.RequestID),
				attribute.Int("kvroute.matched_blocks", k.Matched),
				attribute.Int("kvroute.prompt_blocks", k.PromptBlocks),
				attribute.Int("kvroute.prompt_tokens", k.prompt.PromptTokens),
				attribute.String("kvroute.policy", string(k.Policy)),
				attribute.Bool("kvroute.degraded", k.Degraded),
				attribute.String("kvroute.tokenization", string(k.prompt.Source)),
			)
			if k.Mode != "" {
				span.SetAttributes(attribute.String("kvroute.mode", k.Mode))
			}
			if k.Reason != "" {
				span.SetAttributes(attribute.String("kvroute.degraded_reason", k.Reason))
			}
			if k.prompt.Blind != "" {
				span.SetAttributes(attribute.String("kvroute.cache_blind", k.prompt.Blind))
			}
			if k.Approximate {
				span.SetAttributes(attribute.Bool("kvroute.approximate", true))
			}
			if k.IndexIncomplete {
				span.SetAttributes(attribute.Bool("kvroute.index_incomplete", true))
			}
		}
	}
	span.End()
}

// startProxy starts the span of a proxied request's upstream round trip,
// which the replica gets as its parent (traceparent): it ends when the
// reverse proxy has copied the whole response, or failed.
func (s *Server) startProxy(ctx context.Context, k keyed) (context.Context, trace.Span) {
	ctx, span := s.tracer.Start(ctx, "kvroute.proxy", trace.WithSpanKind(trace.SpanKindClient))
	if span.IsRecording() {
		span.SetAttributes(attribute.String("kvroute.replica", k.Replica.ID), attribute.String("server.address", k.Replica.URL))
	}
	return ctx, span
}

// inject writes ctx's trace context into a request to a replica.
func (s *Server) inject(ctx context.Context, h http.Header) {
	s.cfg.Propagator.Inject(ctx, propagation.HeaderCarrier(h))
}

// statusLabel is the status label of a proxied request's count.
func statusLabel(status int) metric.MeasurementOption {
	return label("status", strconv.Itoa(status))
}
