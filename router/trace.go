package router

import (
	"context"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// tracerName is the instrumentation scope of the router's spans.
const tracerName = "github.com/kvroute/kvroute/router"

// Stages is how long a decision spent in each of its steps, for the
// per-stage latency histograms the API records: where a slow decision's
// time went (a registry re-read, a long prompt's keying, the lookup's
// round trip, scoring a large fleet, lost booking races) without a trace.
// Reserve includes the loads re-read after a lost race; Scoring every
// re-score.
type Stages struct {
	Registry, Keying, Lookup, Scoring, Reserve time.Duration
}

// newTracer is the router's tracer from tp, or from the global provider
// (a no-op unless a program sets one) when tp is nil.
func newTracer(tp trace.TracerProvider) trace.Tracer {
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	return tp.Tracer(tracerName)
}

// stage is one step of a decision in progress: its span and its timer.
type stage struct {
	span  trace.Span
	start time.Time
	acc   *time.Duration
}

// stage starts step name as a child of ctx's span; acc (nil: untimed)
// accumulates its time when it ends.
func (r *Router) stage(ctx context.Context, name string, acc *time.Duration) (context.Context, stage) {
	ctx, span := r.tracer.Start(ctx, name)
	return ctx, stage{span: span, start: time.Now(), acc: acc}
}

// end ends the step, with err (nil: none) as its status and attrs on it.
func (s stage) end(err error, attrs ...attribute.KeyValue) {
	if s.acc != nil {
		*s.acc += time.Since(s.start)
	}
	if s.span.IsRecording() {
		s.span.SetAttributes(attrs...)
		if err != nil {
			s.span.RecordError(err)
			s.span.SetStatus(codes.Error, err.Error())
		}
	}
	s.span.End()
}
