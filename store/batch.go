package store

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Coalescing a decision's commands with its neighbours'. Redis spends most
// of a small command's time on the round trip around it, not on the
// command: on this project's machines a GET costs about 9 µs of Redis's
// thread sent one per round trip and under 1 µs sixteen to a round trip, and a
// decision makes two to four round trips. When decisions are in flight
// together, the ones that find every pipeline busy wait for the next one
// to go out and share it: one write and one read for all of them, on the
// pod and on Redis. A decision alone goes out at once, on its own context,
// so coalescing costs nothing unloaded. It is what a client with automatic
// pipelining does over one connection; go-redis v9.23's AutoPipeline is
// experimental, so the store batches the decision path's commands itself
// (plain lookups, loads, bookings and their release), which also lets it
// keep one batcher per model: a model's commands all go to its slot, so a
// shard that hangs holds up only its own models' decisions, never another
// shard's. A shared pipeline is traced (go-redis's hooks) under the first
// waiter's span; the others' traces show their wait inside their own stage
// spans.

// coalesced bounds the pipelines one model's batcher has in flight. Each
// is one connection's round trip; a decision that finds them all busy
// waits for the first to come back (a round trip, or its deadline when
// the shard hangs) to be sent with the others waiting. Fewer means bigger
// batches and less Redis time per decision, more means less waiting: with
// one, two or four the shard's ceiling measured the same within noise
// (BENCHMARKS.md).
const coalesced = 4

// maxShared bounds the callers one pipeline carries, so that its replies
// come back within the client's read timeout however slow the server (the
// embedded miniredis under the race detector ran 90 commands of Lua in
// one pipeline past 500 ms) and no caller waits behind a queue's worth of
// others' work.
const maxShared = 16

// batcher sends callers' commands in shared pipelines.
type batcher struct {
	c   redis.UniversalClient
	max int

	mu      sync.Mutex
	running int        // pipelines in flight
	queue   []*batchOp // waiting for one to finish
}

type batchOp struct {
	ctx  context.Context
	cmds []redis.Cmder
	done chan struct{}
}

// do sends cmds and returns when their replies (or errors) are in them. It
// returns the first command's error, as Pipelined does, or ctx's when ctx
// ends first. The caller must not read cmds after an error: when ctx ended
// first, a command still queued is dropped, but one already sent may be
// having its reply written (and what it did in Redis stands, as for any
// command whose caller timed out).
func (b *batcher) do(ctx context.Context, cmds ...redis.Cmder) error {
	b.mu.Lock()
	if b.running < b.max {
		b.running++
		b.mu.Unlock()
		err := b.send(ctx, cmds)
		b.next()
		return err
	}
	op := &batchOp{ctx: ctx, cmds: cmds, done: make(chan struct{})}
	b.queue = append(b.queue, op)
	b.mu.Unlock()
	select {
	case <-op.done:
		return firstErr(cmds)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// next hands the pipeline just finished to whoever queued meanwhile, on a
// goroutine of its own so that the caller that sent it returns at once.
func (b *batcher) next() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.running--
		b.mu.Unlock()
		return
	}
	q := b.take()
	b.mu.Unlock()
	go b.drain(q)
}

// take removes up to maxShared waiting ops from the queue; b.mu is held.
func (b *batcher) take() []*batchOp {
	n := min(len(b.queue), maxShared)
	q := make([]*batchOp, n)
	copy(q, b.queue)
	b.queue = append(b.queue[:0], b.queue[n:]...)
	return q
}

func (b *batcher) drain(q []*batchOp) {
	for {
		live := q[:0]
		var cmds []redis.Cmder
		for _, op := range q {
			if op.ctx.Err() != nil {
				continue // its caller has given up; never send it
			}
			live = append(live, op)
			cmds = append(cmds, op.cmds...)
		}
		if len(live) > 0 {
			ctx, cancel := batchContext(live)
			_ = b.send(ctx, cmds)
			cancel()
			for _, op := range live {
				close(op.done)
			}
		}
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.running--
			b.mu.Unlock()
			return
		}
		q = b.take()
		b.mu.Unlock()
	}
}

func (b *batcher) send(ctx context.Context, cmds []redis.Cmder) error {
	if len(cmds) == 1 {
		return b.c.Process(ctx, cmds[0])
	}
	_, err := b.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for _, c := range cmds {
			_ = p.Process(ctx, c)
		}
		return nil
	})
	return err
}

// batchContext is the context a shared pipeline runs under: the first
// waiter's values (so that its trace holds the Redis span) and the latest
// of their deadlines, so that no waiter's time is cut short by another's.
// A waiter without a deadline leaves the pipeline to the client's own
// timeouts.
func batchContext(ops []*batchOp) (context.Context, context.CancelFunc) {
	base := context.WithoutCancel(ops[0].ctx)
	var latest time.Time
	for _, op := range ops {
		d, ok := op.ctx.Deadline()
		if !ok {
			return context.WithCancel(base)
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(base, latest)
}

func firstErr(cmds []redis.Cmder) error {
	for _, c := range cmds {
		if err := c.Err(); err != nil {
			return err
		}
	}
	return nil
}

// batcher is model's batcher (its keys share one slot).
func (s *Store) batcher(model string) *batcher {
	if b, ok := s.batches.Load(model); ok {
		return b.(*batcher)
	}
	b, _ := s.batches.LoadOrStore(model, &batcher{c: s.c, max: coalesced})
	return b.(*batcher)
}

// evalBatched runs script sc, on model's keys, through model's batcher:
// EVALSHA, and EVAL alone if the server does not know the script (a
// restarted or flushed Redis), which also loads it for the next call. A
// failed send is a fresh command holding the error: the one sent may still
// be written to (see do).
func (s *Store) evalBatched(ctx context.Context, model string, sc *redis.Script, keys []string, args ...any) *redis.Cmd {
	cmdArgs := make([]any, 0, 3+len(keys)+len(args))
	cmdArgs = append(cmdArgs, "evalsha", sc.Hash(), len(keys))
	for _, k := range keys {
		cmdArgs = append(cmdArgs, k)
	}
	cmdArgs = append(cmdArgs, args...)
	cmd := redis.NewCmd(ctx, cmdArgs...)
	if err := s.batcher(model).do(ctx, cmd); err != nil {
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			return sc.Eval(ctx, s.c, keys, args...)
		}
		failed := redis.NewCmd(ctx, cmdArgs...)
		failed.SetErr(err)
		return failed
	}
	return cmd
}

// hmget is an HMGET command to send through the batcher.
func hmget(ctx context.Context, key string, fields []string) *redis.SliceCmd {
	args := make([]any, 2, 2+len(fields))
	args[0], args[1] = "hmget", key
	for _, f := range fields {
		args = append(args, f)
	}
	return redis.NewSliceCmd(ctx, args...)
}
