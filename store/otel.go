package store

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"strings"
	"sync"

	"github.com/redis/go-redis/extra/redisotel/v9"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/embedded"
	"go.opentelemetry.io/otel/trace/noop"
)

// instrument traces c's commands through go-redis's OpenTelemetry hooks
// (redisotel), as children of the caller's span: a decision's lookup and
// reserve spans get their EVALSHA under them. It is installed when the
// client is built, so that a Cluster's every node gets the hook.
//
// The tracer provider is the parent span's own (parentProvider): a
// command made outside any recording span (the ingestor's registry polls
// and sweeps, an untraced pod's every call) makes no span and costs the
// no-op's nothing, and two in-process pods with different providers (the
// tests, the tracing benchmark) each trace their own. Statements are left
// out (a lookup's arguments are every block key of the prompt) and so is
// the caller's file and line (a stack walk per command).
func instrument(c redis.UniversalClient) redis.UniversalClient {
	err := redisotel.InstrumentTracing(c, redisotel.WithTracerProvider(parentProvider{}),
		redisotel.WithDBStatement(false), redisotel.WithCallerEnabled(false))
	if err != nil {
		return c
	}
	// Added after redisotel's hook, so inside it: it sees that span.
	switch c := c.(type) {
	case *redis.ClusterClient:
		c.OnNewNode(func(n *redis.Client) { n.AddHook(scriptNamer{}) })
	case *redis.Client:
		c.AddHook(scriptNamer{})
	}
	return c
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

// scriptNamer names a script's span after the script ("evalsha
// lookup.lua") instead of the bare command, so that a trace says which
// of the store's scripts ran.
type scriptNamer struct{}

func (scriptNamer) DialHook(next redis.DialHook) redis.DialHook { return next }

func (scriptNamer) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			if n := scriptOf(cmd); n != "" {
				span.SetName(cmd.Name() + " " + n)
				span.SetAttributes(attribute.String("kvroute.script", n))
			}
		}
		return next(ctx, cmd)
	}
}

func (scriptNamer) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if span := trace.SpanFromContext(ctx); span.IsRecording() {
			ops := make([]string, len(cmds))
			for i, cmd := range cmds {
				ops[i] = operation(cmd)
			}
			span.SetName("redis.pipeline " + strings.Join(ops, " "))
		}
		return next(ctx, cmds)
	}
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
		"approx.lua": scriptApprox, "sweepapprox.lua": scriptSweepAx, "reserve.lua": scriptReserve,
		"advance.lua": scriptAdvance, "release.lua": scriptRelease, "sweep.lua": scriptSweep,
		"acquire.lua": scriptAcquire, "disown.lua": scriptDisown,
	} {
		m[s.Hash()] = name
	}
	return m
})

// parentProvider makes spans with the provider of the span in the
// context, and none outside a recording span (see instrument).
type parentProvider struct{ embedded.TracerProvider }

func (parentProvider) Tracer(name string, opts ...trace.TracerOption) trace.Tracer {
	return parentTracer{name: name, opts: opts}
}

type parentTracer struct {
	embedded.Tracer
	name string
	opts []trace.TracerOption
}

func (t parentTracer) Start(ctx context.Context, spanName string, opts ...trace.SpanStartOption) (context.Context, trace.Span) {
	parent := trace.SpanFromContext(ctx)
	if !parent.IsRecording() {
		return ctx, noop.Span{}
	}
	return parent.TracerProvider().Tracer(t.name, t.opts...).Start(ctx, spanName, opts...)
}
