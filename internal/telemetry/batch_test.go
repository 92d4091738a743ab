package telemetry_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"go.opentelemetry.io/otel"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"

	"github.com/kvroute/kvroute/internal/telemetry"
	"github.com/kvroute/kvroute/internal/wait"
)

// fakeExporter records what it is sent; Export, when set, runs first
// (a test blocks it there).
type fakeExporter struct {
	Export func(ctx context.Context) error

	mu       sync.Mutex
	batches  [][]string
	shutdown bool
}

func (e *fakeExporter) ExportSpans(ctx context.Context, spans []sdktrace.ReadOnlySpan) error {
	if e.Export != nil {
		if err := e.Export(ctx); err != nil {
			return err
		}
	}
	var names []string
	for _, s := range spans {
		names = append(names, s.Name())
	}
	e.mu.Lock()
	defer e.mu.Unlock()
	e.batches = append(e.batches, names)
	return nil
}

func (e *fakeExporter) Shutdown(context.Context) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.shutdown = true
	return nil
}

// exported is every span name sent so far, and the batches' sizes.
func (e *fakeExporter) exported() (names []string, sizes []int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, b := range e.batches {
		names = append(names, b...)
		sizes = append(sizes, len(b))
	}
	return names, sizes
}

// waitFor lets the bubble's clock run (a millisecond at a time, once
// every goroutine is blocked) until n spans have been exported or two
// seconds have passed, and returns what was.
func waitFor(tb testing.TB, e *fakeExporter, n int) []string {
	tb.Helper()
	for start := time.Now(); ; time.Sleep(time.Millisecond) {
		synctest.Wait()
		names, _ := e.exported()
		if len(names) >= n || time.Since(start) >= 2*time.Second {
			return names
		}
	}
}

func endSpans(tp *sdktrace.TracerProvider, names ...string) {
	tr := tp.Tracer("test")
	for _, n := range names {
		_, s := tr.Start(context.Background(), n)
		s.End()
	}
}

// recordOnly records every span without sampling it: the processor sees
// it end and must not export it.
type recordOnly struct{}

func (recordOnly) ShouldSample(sdktrace.SamplingParameters) sdktrace.SamplingResult {
	return sdktrace.SamplingResult{Decision: sdktrace.RecordOnly}
}
func (recordOnly) Description() string { return "record only" }

// TestSpanBatcher runs each case in a testing/synctest bubble: the
// batcher's schedule and deadlines run on the bubble's clock, and "nothing
// was exported" is checked once every goroutine is blocked, not after a
// sleep.
func TestSpanBatcher(t *testing.T) {
	ctx := context.Background()
	bubble := func(name string, f func(t *testing.T)) {
		t.Run(name, func(t *testing.T) { synctest.Test(t, f) })
	}
	never := time.Hour // a schedule that never fires within a test
	newTP := func(t *testing.T, e *fakeExporter, o telemetry.BatchOptions, opts ...sdktrace.TracerProviderOption) *sdktrace.TracerProvider {
		t.Helper()
		if o.Timeout == 0 {
			o.Timeout = time.Second
		}
		tp := sdktrace.NewTracerProvider(append(opts, sdktrace.WithSpanProcessor(telemetry.NewSpanBatcher(e, o)))...)
		t.Cleanup(func() { _ = tp.Shutdown(ctx) })
		return tp
	}

	bubble("a whole batch goes at once", func(t *testing.T) {
		e := &fakeExporter{}
		tp := newTP(t, e, telemetry.BatchOptions{Delay: never, MaxQueue: 16, MaxBatch: 4})
		endSpans(tp, "a", "b", "c")
		synctest.Wait()
		if names, _ := e.exported(); len(names) != 0 {
			t.Errorf("exported %v before a batch was whole, want nothing", names)
		}
		endSpans(tp, "d")
		if got := waitFor(t, e, 4); strings.Join(got, ",") != "a,b,c,d" {
			t.Errorf("exported %v, want a,b,c,d", got)
		}
	})

	bubble("the rest goes on schedule", func(t *testing.T) {
		e := &fakeExporter{}
		tp := newTP(t, e, telemetry.BatchOptions{Delay: 20 * time.Millisecond, MaxQueue: 16, MaxBatch: 8})
		endSpans(tp, "a", "b")
		if got := waitFor(t, e, 2); strings.Join(got, ",") != "a,b" {
			t.Errorf("exported %v, want a,b", got)
		}
	})

	bubble("flush sends what is queued, in batches and in order", func(t *testing.T) {
		e := &fakeExporter{}
		tp := newTP(t, e, telemetry.BatchOptions{Delay: never, MaxQueue: 16, MaxBatch: 3})
		// The third span kicks the export goroutine; the flush takes
		// whatever it has not taken yet.
		endSpans(tp, "a", "b", "c", "d", "e", "f", "g")
		if err := tp.ForceFlush(ctx); err != nil {
			t.Fatal(err)
		}
		names, sizes := e.exported()
		if strings.Join(names, ",") != "a,b,c,d,e,f,g" {
			t.Errorf("exported %v, want a to g in order", names)
		}
		for _, n := range sizes {
			if n > 3 {
				t.Errorf("a batch of %d spans, want at most 3 (batches %v)", n, sizes)
			}
		}
	})

	bubble("a full queue drops and says so", func(t *testing.T) {
		release := make(chan struct{})
		held := make(chan struct{}, 1)
		e := &fakeExporter{Export: func(context.Context) error {
			select {
			case held <- struct{}{}:
				<-release // the first export waits for the test
			default:
			}
			return nil
		}}
		var mu sync.Mutex
		var handled []error
		prev := otel.GetErrorHandler()
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { mu.Lock(); handled = append(handled, err); mu.Unlock() }))
		t.Cleanup(func() { otel.SetErrorHandler(prev) })
		tp := newTP(t, e, telemetry.BatchOptions{Delay: never, MaxQueue: 2, MaxBatch: 2})
		endSpans(tp, "a", "b") // a whole batch: its export starts and is held
		<-held
		endSpans(tp, "c", "d", "e") // the queue takes two, drops one
		close(release)
		if err := tp.ForceFlush(ctx); err != nil {
			t.Fatal(err)
		}
		if got := waitFor(t, e, 4); strings.Join(got, ",") != "a,b,c,d" {
			t.Errorf("exported %v, want a,b,c,d (e dropped)", got)
		}
		mu.Lock()
		defer mu.Unlock()
		if len(handled) != 1 || !strings.HasSuffix(handled[0].Error(), "was full: dropped 1") {
			t.Errorf("errors handled: %v, want one saying 1 span was dropped", handled)
		}
	})

	bubble("unsampled spans are not exported", func(t *testing.T) {
		e := &fakeExporter{}
		tp := newTP(t, e, telemetry.BatchOptions{Delay: never, MaxQueue: 16, MaxBatch: 1}, sdktrace.WithSampler(recordOnly{}))
		endSpans(tp, "a")
		if err := tp.ForceFlush(ctx); err != nil {
			t.Fatal(err)
		}
		if names, _ := e.exported(); len(names) != 0 {
			t.Errorf("exported %v, want nothing", names)
		}
	})

	bubble("shutdown flushes, stops and shuts the exporter", func(t *testing.T) {
		e := &fakeExporter{}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(telemetry.NewSpanBatcher(e, telemetry.BatchOptions{Delay: never, Timeout: time.Second, MaxQueue: 16, MaxBatch: 8})))
		endSpans(tp, "a", "b")
		if err := tp.Shutdown(ctx); err != nil {
			t.Fatal(err)
		}
		endSpans(tp, "late")
		names, _ := e.exported()
		if strings.Join(names, ",") != "a,b" {
			t.Errorf("exported %v, want a,b", names)
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		if !e.shutdown {
			t.Errorf("exporter not shut down")
		}
	})

	bubble("flush returns the exporter's error", func(t *testing.T) {
		e := &fakeExporter{Export: func(context.Context) error { return errors.New("collector said no") }}
		tp := newTP(t, e, telemetry.BatchOptions{Delay: never, MaxQueue: 16, MaxBatch: 8})
		endSpans(tp, "a")
		if err := tp.ForceFlush(ctx); err == nil || !strings.Contains(err.Error(), "collector said no") {
			t.Errorf("ForceFlush = %v, want the exporter's error", err)
		}
	})

	// Not in a bubble: the export the deadlines leave behind holds the
	// bubble open. The real clock, and waits on the exporter.
	t.Run("flush and shutdown honour their deadlines", func(t *testing.T) {
		release := make(chan struct{})
		e := &fakeExporter{Export: func(ctx context.Context) error {
			<-release
			return ctx.Err() // a real exporter fails on a done context
		}}
		tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(telemetry.NewSpanBatcher(e, telemetry.BatchOptions{Delay: never, Timeout: time.Minute, MaxQueue: 16, MaxBatch: 8})))
		endSpans(tp, "a", "b")
		short := func() context.Context {
			c, cancel := context.WithTimeout(ctx, 30*time.Millisecond)
			t.Cleanup(cancel)
			return c
		}
		t0 := time.Now()
		if err := tp.ForceFlush(short()); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("ForceFlush behind a stuck export = %v, want its deadline", err)
		}
		endSpans(tp, "c")
		if err := tp.Shutdown(short()); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Shutdown behind a stuck export = %v, want its deadline", err)
		}
		if took := time.Since(t0); took > time.Second {
			t.Errorf("ForceFlush and Shutdown took %v with 30 ms deadlines", took)
		}
		close(release) // the exports go on behind the deadlines, with live contexts
		wait.Until(t, "a,b,c exported after the deadlines", func() bool {
			names, _ := e.exported()
			return strings.Join(names, ",") == "a,b,c"
		})
		wait.Until(t, "the exporter shut down after Shutdown's deadline passed", func() bool {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.shutdown
		})
	})

	bubble("flush honours a done context", func(t *testing.T) {
		e := &fakeExporter{}
		tp := newTP(t, e, telemetry.BatchOptions{Delay: never, MaxQueue: 16, MaxBatch: 8})
		done, cancel := context.WithCancel(ctx)
		cancel()
		if err := tp.ForceFlush(done); !errors.Is(err, context.Canceled) {
			t.Errorf("ForceFlush(done) = %v, want context.Canceled", err)
		}
	})
}

func TestBatchFromEnv(t *testing.T) {
	for _, tt := range []struct {
		name    string
		env     map[string]string
		want    telemetry.BatchOptions
		wantErr string
	}{
		{name: "defaults", want: telemetry.BatchOptions{Delay: 5 * time.Second, Timeout: 30 * time.Second, MaxQueue: 2048, MaxBatch: 512}},
		{name: "set", env: map[string]string{"OTEL_BSP_SCHEDULE_DELAY": "200", "OTEL_BSP_EXPORT_TIMEOUT": "1000", "OTEL_BSP_MAX_QUEUE_SIZE": "4096", "OTEL_BSP_MAX_EXPORT_BATCH_SIZE": "1024"},
			want: telemetry.BatchOptions{Delay: 200 * time.Millisecond, Timeout: time.Second, MaxQueue: 4096, MaxBatch: 1024}},
		{name: "batch cut to the queue", env: map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "100"},
			want: telemetry.BatchOptions{Delay: 5 * time.Second, Timeout: 30 * time.Second, MaxQueue: 100, MaxBatch: 100}},
		{name: "no export timeout", env: map[string]string{"OTEL_BSP_EXPORT_TIMEOUT": "0"},
			want: telemetry.BatchOptions{Delay: 5 * time.Second, Timeout: 0, MaxQueue: 2048, MaxBatch: 512}},
		{name: "not a number", env: map[string]string{"OTEL_BSP_SCHEDULE_DELAY": "5s"}, wantErr: `OTEL_BSP_SCHEDULE_DELAY="5s"`},
		{name: "no delay", env: map[string]string{"OTEL_BSP_SCHEDULE_DELAY": "0"}, wantErr: `OTEL_BSP_SCHEDULE_DELAY="0"`},
		{name: "negative timeout", env: map[string]string{"OTEL_BSP_EXPORT_TIMEOUT": "-1"}, wantErr: `OTEL_BSP_EXPORT_TIMEOUT="-1"`},
		{name: "zero", env: map[string]string{"OTEL_BSP_MAX_QUEUE_SIZE": "0"}, wantErr: `OTEL_BSP_MAX_QUEUE_SIZE="0"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := telemetry.BatchFromEnv(func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Errorf("err = %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Errorf("got %+v, %v; want %+v", got, err, tt.want)
			}
		})
	}
}
