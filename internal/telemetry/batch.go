package telemetry

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
)

// spanBatcher is the batch span processor the OTEL_BSP_* variables
// describe, built for a pod that ends a dozen spans a decision. The SDK's
// own hands every ended span to its export goroutine over a channel, so
// each span wakes that goroutine: BenchmarkTracingOverhead's profile put
// 43 µs of a traced decision's CPU in that hand-off, most of what tracing
// cost it. Here an ended span is appended to a queue under a mutex, and
// the export goroutine wakes only on its schedule (OTEL_BSP_SCHEDULE_DELAY)
// or when a whole batch (OTEL_BSP_MAX_EXPORT_BATCH_SIZE) is waiting. A
// span that finds the queue full (OTEL_BSP_MAX_QUEUE_SIZE) is dropped and
// counted, as the SDK's is: tracing never holds up a decision.
type spanBatcher struct {
	exp sdktrace.SpanExporter
	opt batchOptions

	mu      sync.Mutex
	queue   []sdktrace.ReadOnlySpan
	dropped int64 // spans dropped since the last report

	stopped bool // Shutdown has begun; guarded by mu

	kick     chan struct{} // a whole batch is waiting (capacity 1)
	stop     chan struct{}
	done     chan struct{}
	exportMu sync.Mutex // one export at a time, in queue order
}

var _ sdktrace.SpanProcessor = (*spanBatcher)(nil)

// batchOptions are the OTEL_BSP_* settings.
type batchOptions struct {
	delay, timeout     time.Duration
	maxQueue, maxBatch int
}

// defaultBatch is the specification's defaults (and the SDK's).
var defaultBatch = batchOptions{delay: 5 * time.Second, timeout: 30 * time.Second, maxQueue: 2048, maxBatch: 512}

// batchFromEnv reads OTEL_BSP_SCHEDULE_DELAY and OTEL_BSP_EXPORT_TIMEOUT
// (milliseconds) and OTEL_BSP_MAX_QUEUE_SIZE and
// OTEL_BSP_MAX_EXPORT_BATCH_SIZE. Unset means the default; a value that
// is not a positive integer (for the export timeout, not a number of
// milliseconds: 0 means none, as the SDK takes it) is an error, so that a
// typo fails the start instead of silently tracing with the defaults. A
// batch larger than the queue is cut to the queue, as the specification
// says.
func batchFromEnv(getenv func(string) string) (batchOptions, error) {
	o := defaultBatch
	var errs []error
	num := func(name string, def, least int) int {
		v := strings.TrimSpace(getenv(name))
		if v == "" {
			return def
		}
		n, err := strconv.Atoi(v)
		if err != nil || n < least {
			want := "a positive integer"
			if least == 0 {
				want = "a number of milliseconds (0: none)"
			}
			errs = append(errs, fmt.Errorf("%s=%q: want %s", name, v, want))
			return def
		}
		return n
	}
	o.delay = time.Duration(num("OTEL_BSP_SCHEDULE_DELAY", int(o.delay/time.Millisecond), 1)) * time.Millisecond
	o.timeout = time.Duration(num("OTEL_BSP_EXPORT_TIMEOUT", int(o.timeout/time.Millisecond), 0)) * time.Millisecond
	o.maxQueue = num("OTEL_BSP_MAX_QUEUE_SIZE", o.maxQueue, 1)
	o.maxBatch = min(num("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", o.maxBatch, 1), o.maxQueue)
	if err := errors.Join(errs...); err != nil {
		return batchOptions{}, fmt.Errorf("telemetry: %w", err)
	}
	return o, nil
}

func newSpanBatcher(exp sdktrace.SpanExporter, opt batchOptions) *spanBatcher {
	b := &spanBatcher{exp: exp, opt: opt, kick: make(chan struct{}, 1), stop: make(chan struct{}), done: make(chan struct{})}
	go b.run()
	return b
}

// OnStart does nothing: spans are batched when they end.
func (b *spanBatcher) OnStart(context.Context, sdktrace.ReadWriteSpan) {}

// OnEnd queues a sampled span, or drops it when the queue is full. After
// Shutdown it does nothing: stopped is read under mu, so a span either
// lands in the queue Shutdown's last export takes or is not queued.
func (b *spanBatcher) OnEnd(s sdktrace.ReadOnlySpan) {
	if !s.SpanContext().IsSampled() {
		return
	}
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return
	}
	if len(b.queue) >= b.opt.maxQueue {
		b.dropped++
		b.mu.Unlock()
		return
	}
	b.queue = append(b.queue, s)
	whole := len(b.queue) == b.opt.maxBatch
	b.mu.Unlock()
	if whole {
		select {
		case b.kick <- struct{}{}:
		default: // already kicked
		}
	}
}

func (b *spanBatcher) run() {
	defer close(b.done)
	tick := time.NewTicker(b.opt.delay)
	defer tick.Stop()
	for {
		whole := false
		select {
		case <-b.stop:
			return
		case <-tick.C:
		case <-b.kick:
			whole = true
		}
		if err := b.export(context.Background(), whole); err != nil {
			otel.Handle(err)
		}
	}
}

// export sends what is queued in batches, each within the export timeout
// (none when it is 0): only whole batches when whole is set (the rest
// waits to fill up or for the schedule), else everything. It returns the
// exporter's errors; the schedule's own exports hand them to the global
// error handler, as the SDK's do.
func (b *spanBatcher) export(ctx context.Context, whole bool) error {
	b.exportMu.Lock()
	defer b.exportMu.Unlock()
	b.mu.Lock()
	n := len(b.queue)
	if whole {
		n -= n % b.opt.maxBatch
	}
	spans, dropped := b.queue[:n], b.dropped
	rest := make([]sdktrace.ReadOnlySpan, len(b.queue)-n, max(len(b.queue)-n, b.opt.maxBatch))
	copy(rest, b.queue[n:])
	b.queue, b.dropped = rest, 0
	b.mu.Unlock()
	if dropped > 0 {
		otel.Handle(fmt.Errorf("telemetry: the span export queue (OTEL_BSP_MAX_QUEUE_SIZE=%d) was full: dropped %d", b.opt.maxQueue, dropped))
	}
	var errs []error
	for len(spans) > 0 {
		n := min(len(spans), b.opt.maxBatch)
		ectx, cancel := ctx, context.CancelFunc(func() {})
		if b.opt.timeout > 0 {
			ectx, cancel = context.WithTimeout(ctx, b.opt.timeout)
		}
		if err := b.exp.ExportSpans(ectx, spans[:n]); err != nil {
			errs = append(errs, fmt.Errorf("telemetry: export spans: %w", err))
		}
		cancel()
		spans = spans[n:]
	}
	return errors.Join(errs...)
}

// ForceFlush exports what is queued now, and returns the exporter's
// errors, or ctx's when it ends first (the export goes on behind it). It
// does nothing after Shutdown.
func (b *spanBatcher) ForceFlush(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	b.mu.Lock()
	stopped := b.stopped
	b.mu.Unlock()
	if stopped {
		return nil
	}
	done := make(chan error, 1)
	// The export keeps going when ctx ends first, under the export
	// timeout alone: the spans it took are sent, not dropped.
	go func() { done <- b.export(context.WithoutCancel(ctx), false) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Shutdown stops the schedule, exports what is queued and shuts the
// exporter down, and returns their errors, or ctx's when it ends first:
// the last export and the exporter's shutdown then go on behind it, so
// that a short deadline costs no spans that an export could still
// deliver. Spans that end afterwards are not exported; a second Shutdown
// does nothing.
func (b *spanBatcher) Shutdown(ctx context.Context) error {
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return nil
	}
	b.stopped = true
	b.mu.Unlock()
	close(b.stop)
	done := make(chan error, 1)
	go func() {
		<-b.done // the schedule's export in hand, if any, finishes first
		err := b.export(context.WithoutCancel(ctx), false)
		done <- errors.Join(err, b.exp.Shutdown(context.WithoutCancel(ctx)))
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}
