package store

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// instrument traces c's commands as children of the caller's span: a
// decision's lookup and reserve spans get their EVALSHA under them, named
// after the script ("evalsha reserve.lua"). It is installed when the
// client is built, so that a Cluster's every node gets the hook.
//
// A span is made only under a recording span, with that span's own
// provider: a command made outside one (the ingestor's registry polls and
// sweeps, an untraced pod's every call) costs one check, and two
// in-process pods with different providers (the tests, the tracing
// benchmark) each trace their own. go-redis's own OpenTelemetry hook
// (redisotel) formats every pipeline's arguments before it asks whether
// anyone records, about 16 µs of a pod's CPU per 2,048-block decision
// traced or not, which is why the store has its own. Statements are left
// out: a lookup's arguments are every block key of the prompt.
func instrument(c redis.UniversalClient) redis.UniversalClient {
	switch c := c.(type) {
	case *redis.ClusterClient:
		c.OnNewNode(func(n *redis.Client) { n.AddHook(newTracingHook(n.Options().Addr)) })
	case *redis.Client:
		c.AddHook(newTracingHook(c.Options().Addr))
	case *redis.Ring:
		c.OnNewNode(func(n *redis.Client) { n.AddHook(newTracingHook(n.Options().Addr)) })
	}
	return c
}

// tracerName is the instrumentation scope of the store's Redis spans.
const tracerName = "github.com/kvroute/kvroute/store"

// tracingHook makes a client span per command or pipeline under a
// recording parent.
type tracingHook struct{ attrs []attribute.KeyValue }

func newTracingHook(addr string) tracingHook {
	attrs := []attribute.KeyValue{attribute.String("db.system", "redis")}
	if host, port, err := net.SplitHostPort(addr); err == nil {
		attrs = append(attrs, attribute.String("server.address", host))
		if p, err := strconv.Atoi(port); err == nil {
			attrs = append(attrs, attribute.Int("server.port", p))
		}
	}
	return tracingHook{attrs: attrs}
}

func (h tracingHook) start(ctx context.Context, name string, extra ...attribute.KeyValue) (context.Context, trace.Span, bool) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, nil, false
	}
	ctx, span := parent.TracerProvider().Tracer(tracerName).Start(ctx, name,
		trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(h.attrs...), trace.WithAttributes(extra...))
	return ctx, span, true
}

func end(span trace.Span, err error) {
	if err != nil && err != redis.Nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}

func (tracingHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h tracingHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !trace.SpanFromContext(ctx).IsRecording() {
			return next(ctx, cmd)
		}
		name := cmd.FullName()
		var extra []attribute.KeyValue
		if n := scriptOf(cmd); n != "" {
			name = cmd.Name() + " " + n
			extra = append(extra, attribute.String("kvroute.script", n))
		}
		ctx, span, ok := h.start(ctx, name, extra...)
		if !ok {
			return next(ctx, cmd)
		}
		err := next(ctx, cmd)
		end(span, err)
		return err
	}
}

func (h tracingHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !trace.SpanFromContext(ctx).IsRecording() {
			return next(ctx, cmds)
		}
		// Named after its distinct operations in order, so that a shared
		// pipeline (batch.go) of many decisions' commands gets the name of
		// one decision's.
		ops := make([]string, 0, 4)
		for _, cmd := range cmds {
			if op := operation(cmd); !slices.Contains(ops, op) {
				ops = append(ops, op)
			}
		}
		ctx, span, _ := h.start(ctx, "redis.pipeline "+strings.Join(ops, " "), attribute.Int("db.redis.num_cmd", len(cmds)))
		err := next(ctx, cmds)
		end(span, err)
		return err
	}
}

// CountErrors counts the commands Redis failed, by operation (the command,
// or the script an EVALSHA runs, e.g. "lookup.lua"), in
// kvroute_redis_errors_total on mp: what failed, not only that decisions
// went degraded. A missing key (redis.Nil), a NOSCRIPT that go-redis
// answers by sending the script, and a caller that gave up
// (context.Canceled) are not failures, nor is a connection handshake an
// older server refuses. Call it once, before traffic.
func (s *Store) CountErrors(mp metric.MeterProvider) error {
	c, err := mp.Meter("github.com/kvroute/kvroute/store").Int64Counter("kvroute_redis_errors_total",
		metric.WithDescription("Redis commands that failed (connection errors and timeouts included), by operation: the command, or the script an EVALSHA ran."))
	if err != nil {
		return err
	}
	s.c.AddHook(errorCounter{c})
	if s.reads.c != nil {
		s.reads.c.AddHook(errorCounter{c})
	}
	return nil
}

type errorCounter struct{ c metric.Int64Counter }

func (h errorCounter) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h errorCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if failed(cmd, err) {
			h.c.Add(ctx, 1, metric.WithAttributes(attribute.String("operation", operation(cmd))))
		}
		return err
	}
}

func (h errorCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, cmd := range cmds {
			if failed(cmd, cmd.Err()) {
				h.c.Add(ctx, 1, metric.WithAttributes(attribute.String("operation", operation(cmd))))
			}
		}
		return err
	}
}

// failed reports whether cmd's err is a failure to count. A new
// connection's handshake (HELLO, CLIENT SETINFO, CLIENT
// MAINT_NOTIFICATIONS) is refused by older servers, which go-redis
// expects and ignores; the store itself sends neither.
func failed(cmd redis.Cmder, err error) bool {
	if err == nil || err == redis.Nil || errors.Is(err, context.Canceled) || redis.HasErrorPrefix(err, "NOSCRIPT") {
		return false
	}
	switch cmd.Name() {
	case "hello", "client":
		return false
	}
	return true
}

// operation is what a command did: its script's name, else its name.
func operation(cmd redis.Cmder) string {
	if n := scriptOf(cmd); n != "" {
		return n
	}
	return cmd.Name()
}

// scriptOf names the store script an EVALSHA or EVAL runs; "" for any
// other command (or a script that is not the store's).
func scriptOf(cmd redis.Cmder) string {
	args := cmd.Args()
	if len(args) < 2 {
		return ""
	}
	arg, _ := args[1].(string)
	switch cmd.Name() {
	case "evalsha", "evalsha_ro":
		return scriptNames()[arg]
	case "eval", "eval_ro":
		sum := sha1.Sum([]byte(arg))
		return scriptNames()[hex.EncodeToString(sum[:])]
	}
	return ""
}

// scriptNames maps each script's SHA-1 to the file it is built from.
var scriptNames = sync.OnceValue(func() map[string]string {
	m := map[string]string{}
	for name, s := range map[string]*redis.Script{
		"apply.lua": scriptApply, "applyfast.lua": scriptApplyF, "slot.lua": scriptSlot,
		"reset.lua": scriptReset, "purge.lua": scriptPurge, "lookup.lua": scriptLookup,
		"approx.lua": scriptApprox, "sweepapprox.lua": scriptSweepAx, "reserve.lua": scriptReserve, "reservebest.lua": scriptReserveBest,
		"advance.lua": scriptAdvance, "release.lua": scriptRelease, "sweep.lua": scriptSweep,
		"acquire.lua": scriptAcquire, "disown.lua": scriptDisown,
	} {
		m[s.Hash()] = name
	}
	return m
})
