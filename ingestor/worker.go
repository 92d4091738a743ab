package ingestor

import (
	"context"
	"errors"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor/kvevents"
)

// feed is one input of a replica's worker: a live message, or the signal
// that its stream (re)connected and the follower must sync.
type feed struct {
	frames [][]byte
	resync bool
}

// backoff computes jittered exponential delays ("full jitter": uniform in
// [d/2, d]), so that ingestors redialling a replica that came back do not
// arrive in lockstep.
type backoff struct {
	min, max time.Duration
	rnd      func() float64
	n        int
}

func (b *backoff) next() time.Duration {
	d := b.min << min(b.n, 20)
	if d > b.max || d <= 0 {
		d = b.max
	}
	b.n++
	return d/2 + time.Duration(b.rnd()*float64(d/2))
}

func (b *backoff) reset() { b.n = 0 }

// lockedRand makes one injected *rand.Rand safe for every goroutine.
type lockedRand struct {
	mu sync.Mutex
	r  *rand.Rand
}

func (l *lockedRand) Float64() float64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.r.Float64()
}

// workerConfig is everything one replica's worker needs.
type workerConfig struct {
	rep          kvroute.Replica
	follower     *Follower
	transport    Transport
	dial         bool // false in bind mode: the dispatcher feeds the worker
	stallTimeout time.Duration
	minBackoff   time.Duration
	maxBackoff   time.Duration
	rnd          func() float64
	m            *Metrics
	log          *slog.Logger
	now          func() time.Time
	// onSynced is called after every catch-up on the replica's stream
	// that succeeds (the first, each reconnection's, each rebuild after
	// the store lost its data), so that the registry says the replica is
	// followed again after whatever cleared it; nil means nobody is told.
	onSynced func(ctx context.Context)
	// onFenced is called, once until the worker is reclaimed, when the
	// store refused the follower's writes: another ingestor claimed the
	// replica. It must not block (the ingestor answers asynchronously,
	// with reclaimed or by stopping the worker); nil means the worker
	// stays fenced.
	onFenced func()
}

// maxDrain bounds the messages a worker takes off its queue at once.
const maxDrain = 256

// worker follows one replica: in dial mode it owns the SUB connection and
// redials it with backoff; in both modes it applies messages in order and
// notices a stream that went silent.
type worker struct {
	workerConfig
	in     chan feed
	redial chan struct{}
	purged chan struct{}
	resync chan struct{} // the store lost its data: catch up again
	// reclaim: the ingestor claimed the replica back after the store
	// fenced the follower; fenceSent says onFenced was called since.
	reclaim   chan struct{}
	fenceSent atomic.Bool
	feeds     []feed           // reused by drain
	bs        []kvevents.Batch // reused by handle

	mu        sync.Mutex
	downSince time.Time // zero while the stream is connected
	stalled   bool
	// wasSynced is set by the first successful catch-up (onSynced).
	wasSynced atomic.Bool
	// resets counts the store losses signalled (storeReset); syncedAt is
	// the count a successful catch-up last started under, so that one
	// that began before a loss does not pass for a rebuild after it.
	resets, syncedAt atomic.Int64
}

// synced reports whether the worker ever caught up on its stream.
func (w *worker) synced() bool { return w.wasSynced.Load() }

// caughtUp reports whether the worker caught up on its stream since the
// store last lost its data: only then is its replica's index complete.
func (w *worker) caughtUp() bool {
	return w.wasSynced.Load() && w.syncedAt.Load() == w.resets.Load()
}

// storeReset tells the worker the store lost its data: it catches up
// again at once, which finds no applied seq and rebuilds the replica from
// its replay buffer, and until then it is not caught up.
func (w *worker) storeReset() {
	w.resets.Add(1)
	select {
	case w.resync <- struct{}{}:
	default:
	}
}

// reclaimed tells a fenced worker that its ingestor claimed the replica
// back: it re-reads the store and catches up.
func (w *worker) reclaimed() {
	select {
	case w.reclaim <- struct{}{}:
	default:
	}
}

func newWorker(c workerConfig) *worker {
	w := &worker{
		workerConfig: c,
		in:           make(chan feed, 1024),
		redial:       make(chan struct{}, 1),
		purged:       make(chan struct{}, 1),
		resync:       make(chan struct{}, 1),
		reclaim:      make(chan struct{}, 1),
	}
	w.downSince = c.now()
	return w
}

// eventsDown reports how long the replica's event stream has been
// unreachable (zero: it is connected). The ingestor's health check counts a
// stream that cannot even be dialled as a failed probe: the index for that
// replica is going stale.
func (w *worker) eventsDown() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.dial || w.downSince.IsZero() {
		return 0
	}
	return w.now().Sub(w.downSince)
}

func (w *worker) setDown(down bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case down && w.downSince.IsZero():
		w.downSince = w.now()
	case !down:
		w.downSince = time.Time{}
	}
}

// invalidate tells the worker the store's entries for its replica changed
// under it (a purge).
func (w *worker) invalidate() {
	select {
	case w.purged <- struct{}{}:
	default:
	}
}

// run blocks until ctx is done.
func (w *worker) run(ctx context.Context) {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if w.dial {
		wg.Add(1)
		go func() { defer wg.Done(); w.dialLoop(ctx) }()
	} else {
		w.in <- feed{resync: true}
	}
	stall := time.NewTimer(w.stallTimeout)
	defer stall.Stop()
	defer w.m.stalled.DeleteLabelValues(w.rep.ID)
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.purged:
			w.follower.Invalidate()
		case <-w.resync:
			// A quiet replica sends no batch that would find the loss:
			// catch up now, on the connection there is.
			w.handle(ctx, w.drain(feed{resync: true}))
		case <-w.reclaim:
			w.follower.Unfence()
			w.fenceSent.Store(false)
			w.handle(ctx, w.drain(feed{resync: true}))
		case <-stall.C:
			w.mu.Lock()
			w.stalled = true
			w.mu.Unlock()
			w.m.stalled.WithLabelValues(w.rep.ID).Set(1)
			w.log.Debug("event stream silent", "for", w.stallTimeout)
			// An idle engine publishes nothing, so silence alone is no
			// fault; but a silent SUB may also be connected to a dead
			// peer (the ZeroMQ library does not reconnect by itself): dial again.
			if w.dial {
				select {
				case w.redial <- struct{}{}:
				default:
				}
			}
			stall.Reset(w.stallTimeout)
		case f := <-w.in:
			if !stall.Stop() {
				select {
				case <-stall.C:
				default:
				}
			}
			stall.Reset(w.stallTimeout)
			w.mu.Lock()
			was := w.stalled
			w.stalled = false
			w.mu.Unlock()
			if was {
				w.m.stalled.WithLabelValues(w.rep.ID).Set(0)
			}
			w.handle(ctx, w.drain(f))
		}
	}
}

// drain returns f and the messages queued behind it, so that the follower
// can apply consecutive batches together; it never waits for more.
func (w *worker) drain(f feed) []feed {
	fs := append(w.feeds[:0], f)
queued:
	for len(fs) < maxDrain {
		select {
		case g := <-w.in:
			fs = append(fs, g)
		default:
			break queued
		}
	}
	w.feeds = fs
	return fs
}

// handle decodes fs and hands the batches to the follower in order, a
// resync in between splitting them.
func (w *worker) handle(ctx context.Context, fs []feed) {
	// A purge signalled while these messages queued came first: the
	// follower re-reads the store before applying them. It would rebuild
	// the replica either way, but without this it would first apply a
	// batch onto the purged replica and take that for a store loss: a
	// wasted apply and reset, and a false store_lost warning and count.
	select {
	case <-w.purged:
		w.follower.Invalidate()
	default:
	}
	bs := w.bs[:0]
	for _, f := range fs {
		if !f.resync {
			if b, ok := w.decode(f.frames); ok {
				bs = append(bs, b)
			}
			continue
		}
		w.apply(ctx, bs)
		bs = bs[:0]
		w.sync(ctx)
	}
	w.apply(ctx, bs)
	clear(fs) // let the messages go
	w.bs = bs[:0]
	if w.follower.Fenced() && w.fenceSent.CompareAndSwap(false, true) {
		w.log.Info("the store refused this ingestor's writes: another ingestor claimed the replica")
		w.m.fenced.Inc()
		if w.onFenced != nil {
			w.onFenced()
		}
	}
}

// sync catches the follower up on the stream and, when that succeeds,
// records it (onSynced).
func (w *worker) sync(ctx context.Context) {
	gen := w.resets.Load()
	if err := w.follower.Sync(ctx); err != nil {
		if ctx.Err() == nil && !errors.Is(err, kvroute.ErrFenced) {
			w.log.Warn("sync", "err", err)
		}
		return
	}
	w.syncedAt.Store(gen)
	w.wasSynced.Store(true)
	if w.onSynced != nil {
		w.onSynced(ctx)
	}
}

// decode decodes one live message of the worker's replica; it counts and
// drops a bad one.
func (w *worker) decode(frames [][]byte) (kvevents.Batch, bool) {
	b, err := kvevents.Decode(frames)
	if err != nil {
		w.m.decodeErrors.WithLabelValues(kvevents.ReasonOf(err)).Inc()
		w.log.Debug("bad message", "err", err)
		return kvevents.Batch{}, false
	}
	if w.rep.Topic != "" && b.Topic != w.rep.Topic {
		// SUB filters match prefixes: "kv" also lets "kv2" through.
		w.m.decodeErrors.WithLabelValues("topic").Inc()
		return kvevents.Batch{}, false
	}
	return b, true
}

// apply hands batches to the follower, logging what it could not apply:
// the follower has already arranged to catch up (see Follower.Handle).
func (w *worker) apply(ctx context.Context, bs []kvevents.Batch) {
	if len(bs) == 0 {
		return
	}
	if err := w.follower.HandleBatches(ctx, bs); err != nil && ctx.Err() == nil && !errors.Is(err, kvroute.ErrFenced) {
		w.log.Warn("apply", "err", err)
	}
	clear(bs) // let the events go
}

// dialLoop keeps one SUB connection to the replica, redialling with
// jittered backoff when the dial fails, the connection errors, or the
// worker asks for it.
func (w *worker) dialLoop(ctx context.Context) {
	bo := backoff{min: w.minBackoff, max: w.maxBackoff, rnd: w.rnd}
	for ctx.Err() == nil {
		s, err := w.transport.Subscribe(ctx, w.rep.Events, w.rep.Topic)
		if err != nil {
			w.setDown(true)
			d := bo.next()
			w.log.Debug("dial events", "endpoint", w.rep.Events, "err", err, "retry_in", d)
			if !sleep(ctx, d) {
				return
			}
			continue
		}
		w.setDown(false)
		select {
		case w.in <- feed{resync: true}:
		case <-ctx.Done():
			s.Close()
			return
		}
		err = w.read(ctx, s)
		s.Close()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			w.log.Debug("events stream", "err", err)
			if !sleep(ctx, bo.next()) {
				return
			}
			continue
		}
		bo.reset()
	}
}

// read pumps messages from s into the worker until s fails, a redial is
// requested (nil), or ctx ends.
func (w *worker) read(ctx context.Context, s Stream) error {
	errc := make(chan error, 1)
	done := make(chan struct{})
	defer close(done)
	go func() {
		for {
			frames, err := s.Recv()
			if err != nil {
				errc <- err
				return
			}
			select {
			case w.in <- feed{frames: frames}:
			case <-done:
				return
			}
		}
	}()
	select {
	case err := <-errc:
		return err
	case <-w.redial:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// sleep waits d or until ctx ends; false means ctx ended.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
