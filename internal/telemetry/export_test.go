package telemetry

import (
	"time"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// BatchOptions are batchOptions, for tests.
type BatchOptions struct {
	Delay, Timeout     time.Duration
	MaxQueue, MaxBatch int
}

// BatchFromEnv is batchFromEnv, for tests.
func BatchFromEnv(getenv func(string) string) (BatchOptions, error) {
	o, err := batchFromEnv(getenv)
	return BatchOptions{o.delay, o.timeout, o.maxQueue, o.maxBatch}, err
}

// NewSpanBatcher is newSpanBatcher, for tests.
func NewSpanBatcher(exp sdktrace.SpanExporter, o BatchOptions) sdktrace.SpanProcessor {
	return newSpanBatcher(exp, batchOptions{o.Delay, o.Timeout, o.MaxQueue, o.MaxBatch})
}
