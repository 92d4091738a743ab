package ingestor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor/kvevents"
)

// IndexStore is what following one replica's stream needs from the store.
type IndexStore interface {
	KeyLookup
	// ApplyRun applies the ops of the consecutive batches first..last in
	// one atomic call, or nothing when the applied seq is first or newer
	// (see store.Store.ApplyRun). A writer the store does not hold for the
	// replica is refused with kvroute.ErrFenced: another ingestor took it
	// over.
	ApplyRun(ctx context.Context, model, replica, writer string, first, last int64, ops []kvroute.IndexOp) (kvroute.ApplyResult, error)
	// AppliedSeq is the seq of the last batch the store applied for the
	// replica (false: none), where a follower that starts or restarts
	// resumes, so that a gap is replayed rather than skipped.
	AppliedSeq(ctx context.Context, model, replica string) (int64, bool, error)
	// HistoryStart is the first seq of the run that began the replica's
	// history in the store (see store.Store.HistoryStart).
	HistoryStart(ctx context.Context, model, replica string) (int64, bool, error)
	// ResetReplica forgets the replica's event-fed entries and applied
	// seq, before a rebuild from its replay buffer (the engine restarted,
	// or the store lost what it had); fenced as ApplyRun is.
	ResetReplica(ctx context.Context, model, replica, writer string) error
}

// ReplayFunc asks a replica's replay socket for every buffered batch with
// seq >= from and calls fn on each, in order, until the end marker. It
// returns an error when the replica does not answer in time.
type ReplayFunc func(ctx context.Context, from uint64, fn func(kvevents.Batch) error) error

// FollowerConfig configures a Follower. Replica and Store are required;
// every other field has a default, given in its comment.
type FollowerConfig struct {
	// Replica is the replica whose stream is followed: its model and id
	// key everything written for it. Required.
	Replica kvroute.Replica
	// Store is where the replica's batches are applied. Required.
	Store IndexStore
	// Writer names this follower's ingestor to the store, which refuses
	// writes by any other than the replica's claimed writer
	// (kvroute.ErrFenced), so that two ingestors that both believe they
	// follow the replica (a lease handover) cannot interleave a reset
	// with the other's batches. Empty means unfenced: a caller that is
	// the replica's only writer.
	Writer string
	// Replay fetches buffered batches to close gaps. Nil means the replica
	// has no replay endpoint: a gap then clears the replica and rebuilds
	// it from the live stream.
	Replay ReplayFunc
	// Seed is the key-space seed shared with the API, so that event keys
	// match request keys; zero is what kvroute's commands use unless told
	// otherwise.
	Seed uint64
	// Metrics receives the follower's counters. Nil means a set on a
	// no-op meter, for a caller that does not export them.
	Metrics *Metrics
	// Logger receives operational logs. A nil Logger discards
	// (slog.New(slog.DiscardHandler)), as in every kvroute package.
	Logger *slog.Logger
	// Now is the clock event lag is measured against, so that tests can
	// fix it. Nil means time.Now.
	Now func() time.Time
}

// Follower applies one replica's batches to the store in seq order. It is
// the sequencing core of a subscriber, free of sockets so that every case
// (gap, restart, duplicate, short replay buffer) can be tested directly.
//
// The rules:
//   - seq == last+1: apply.
//   - seq > last+1 (a gap: PUB dropped batches): replay from last over the
//     replica's ROUTER socket and apply in order; if the buffer no longer
//     reaches back, or there is no replay socket, clear the replica and
//     rebuild from what the buffer holds and the live stream.
//   - seq <= last: a duplicate if a replay on this connection already
//     delivered it or verified the stored state against the replica's
//     buffer; otherwise (no replay socket) the replica restarted: clear it,
//     then rebuild.
//   - a live seq not above the previous live seq: the replica restarted (one
//     publisher's stream is monotonic).
//
// A replay starts at last, not last+1: the batch at last must come back
// byte-identical; a different one, or no batch at all, means the replica
// restarted while we were away. Each batch is one store call (several
// queued ones may share one, see HandleBatches), which is itself a no-op for
// a seq not newer than the stored one, so an overlap between ingestors
// taking over from each other is harmless.
//
// A Follower is not safe for concurrent use.
type Follower struct {
	rep    kvroute.Replica
	st     IndexStore
	writer string
	replay ReplayFunc
	tr     *Translator
	m      *Metrics
	log    *slog.Logger
	now    func() time.Time

	synced bool   // last/have reflect the store
	have   bool   // some batch is applied
	last   int64  // seq of the last applied batch
	digest uint64 // payload digest of batch last, 0 if unknown

	liveSeq    int64 // last seq seen live on this connection, -1 if none
	replayedTo int64 // highest seq replayed on this connection, -1 if none
	// verified: everything the store holds for the replica is known to
	// come from the publisher we are connected to (a replay checked it, or
	// we built it from this stream). Only then is a live seq at or below
	// the applied one a harmless duplicate (e.g. two ingestors overlapping
	// during a takeover) rather than a restart.
	verified bool
	// lost: a run this follower applied found no applied seq in the store
	// although the follower had applied the stream before: the store lost
	// the replica's entries (see kvroute.ApplyResult.NoPrior), and relearn
	// must rebuild them.
	lost bool
	// failedFirst is the first seq of a run whose apply failed while it
	// continued the follower's history, -1 if none: the script may have run
	// and found the loss, its reply lost with the error. readSeq asks the
	// store whether that run began a new history.
	failedFirst int64
	// fenced: the store refused a write, another ingestor holds the
	// replica. Nothing is applied until Unfence: the caller finds out
	// whether this ingestor still owns the replica.
	fenced bool
	// behind: the store refused a run because its applied seq is older
	// than the run's predecessor (it lost acknowledged batches): refill
	// replays from what it holds.
	behind bool

	// ops and run are reused from one store call to the next.
	ops []kvroute.IndexOp
	run []pending
}

// pending is a translated batch waiting for its store call; its ops end at
// end in Follower.ops.
type pending struct {
	b   *kvevents.Batch
	end int
	st  TranslateStats
}

// NewFollower returns a follower; it reads the applied seq lazily.
func NewFollower(c FollowerConfig) *Follower {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Metrics == nil {
		c.Metrics, _ = NewMetrics(nil) // a no-op meter makes no errors
	}
	return &Follower{
		rep:         c.Replica,
		st:          c.Store,
		writer:      c.Writer,
		replay:      c.Replay,
		tr:          NewTranslator(c.Replica.Model, c.Replica.ID, c.Seed, c.Store),
		m:           c.Metrics,
		log:         c.Logger.With("replica", c.Replica.ID),
		now:         c.Now,
		last:        -1,
		liveSeq:     -1,
		replayedTo:  -1,
		failedFirst: -1,
	}
}

// Last returns the seq of the last batch applied, and false if none is.
func (f *Follower) Last() (int64, bool) { return f.last, f.have }

// Sync is called on every (re)connection: it reads the applied seq from the
// store and catches up from the replay buffer, which also covers the slow
// joiner's first batches and a replica that restarted or published while
// no ingestor listened. A failed replay is logged, not fatal: the live
// stream's seq check still notices what is missing.
func (f *Follower) Sync(ctx context.Context) error {
	if f.fenced {
		return errFenced
	}
	f.liveSeq, f.replayedTo = -1, -1
	if err := f.readSeq(ctx); err != nil {
		return err
	}
	if f.lost {
		// A failed apply had found the store lost the replica: rebuild
		// from the start rather than catch up from the seq it left.
		return f.relearn(ctx)
	}
	if f.replay == nil {
		return nil
	}
	if err := f.catchUp(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if f.fenced {
			return err
		}
		f.log.Warn("replay on connect", "err", err)
		return f.relearn(ctx)
	}
	f.verified = true
	return f.relearn(ctx)
}

// Invalidate makes the next message re-read the store's applied seq, after
// someone else changed the replica's entries (a purge).
func (f *Follower) Invalidate() { f.synced = false }

// errFenced is what a fenced follower answers without asking the store.
var errFenced = fmt.Errorf("ingestor: follow: %w", kvroute.ErrFenced)

// Fenced reports whether the store refused this follower's writes: another
// writer holds the replica.
func (f *Follower) Fenced() bool { return f.fenced }

// Unfence lets a fenced follower write again once its ingestor has claimed
// the replica back; it re-reads the store first, which the other writer
// may have moved on.
func (f *Follower) Unfence() { f.fenced, f.synced = false, false }

// fence notes err when it says the store refused this follower's write.
func (f *Follower) fence(err error) {
	if errors.Is(err, kvroute.ErrFenced) {
		f.fenced, f.synced = true, false
	}
}

func (f *Follower) readSeq(ctx context.Context) error {
	seq, ok, err := f.st.AppliedSeq(ctx, f.rep.Model, f.rep.ID)
	if err != nil {
		return fmt.Errorf("applied seq: %w", err)
	}
	if failed := f.failedFirst; failed >= 0 && ok && seq >= failed {
		// The run that failed, or more, is applied. If it began the
		// history the store now holds, it found the loss and its reply
		// went with the error: the store lost what came before.
		from, has, err := f.st.HistoryStart(ctx, f.rep.Model, f.rep.ID)
		if err != nil {
			return fmt.Errorf("history start: %w", err)
		}
		if has && from == failed {
			f.lost = true
		}
	}
	f.failedFirst = -1
	if !ok {
		// Reset or purged: every cached key may be gone from the store.
		f.tr.Reset()
		seq = -1
	}
	if !ok || seq != f.last || !f.have {
		f.digest = 0
		// Entries applied by someone else (or none at all: then
		// everything to come is from this stream).
		f.verified = !ok
	}
	f.synced, f.have, f.last = true, ok, seq
	return nil
}

// Handle applies one live batch.
func (f *Follower) Handle(ctx context.Context, b kvevents.Batch) error {
	if f.fenced {
		return errFenced
	}
	return errors.Join(f.handle(ctx, b), f.relearn(ctx), f.refill(ctx))
}

func (f *Follower) handle(ctx context.Context, b kvevents.Batch) error {
	if f.fenced {
		return errFenced
	}
	if b.Seq > math.MaxInt64 {
		f.m.decodeErrors.WithLabelValues(kvevents.RejectSeq).Inc()
		return nil
	}
	if !f.synced {
		if err := f.readSeq(ctx); err != nil {
			return err
		}
		f.replayedTo = -1
	}
	s := int64(b.Seq)
	prevLive := f.liveSeq
	f.liveSeq = s
	switch {
	case prevLive >= 0 && s <= prevLive:
		f.log.Info("replica restarted", "seq", s, "previous", prevLive)
		if err := f.reset(ctx, "restart"); err != nil {
			return err
		}
		return f.recover(ctx, b)
	case !f.have && s == 0, f.have && s == f.last+1:
		return f.apply(ctx, b)
	case f.have && s <= f.last:
		if s <= f.replayedTo || f.verified {
			f.m.duplicates.Inc()
			return nil
		}
		f.log.Info("replica restarted", "seq", s, "applied", f.last)
		if err := f.reset(ctx, "restart"); err != nil {
			return err
		}
		return f.recover(ctx, b)
	default:
		// A gap, or joining mid-stream with nothing applied yet.
		f.m.gaps.Inc()
		f.log.Debug("gap", "seq", s, "applied", f.last, "have", f.have)
		return f.recover(ctx, b)
	}
}

// recover applies b after trying to fill everything before it from the
// replay buffer; when that fails it clears the replica and rebuilds from b.
func (f *Follower) recover(ctx context.Context, b kvevents.Batch) error {
	s := int64(b.Seq)
	if f.replay != nil {
		err := f.catchUp(ctx)
		switch {
		case err != nil && ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			f.log.Warn("replay", "err", err)
		case f.have && s <= f.last:
			return nil // covered by the replay
		}
	} else {
		f.m.replays.WithLabelValues("unavailable").Inc()
	}
	if (!f.have && s == 0) || (f.have && s == f.last+1) {
		return f.apply(ctx, b)
	}
	if f.have {
		if err := f.reset(ctx, "gap"); err != nil {
			return err
		}
	}
	return f.apply(ctx, b)
}

var errRestarted = errors.New("replica restarted")

// catchUp replays from the buffer and applies what is newer than last. It
// tries twice: a first pass may find the replica restarted, reset it and
// then rebuild from seq 0.
func (f *Follower) catchUp(ctx context.Context) error {
	for pass := 0; pass < 2; pass++ {
		err := f.replayOnce(ctx)
		if errors.Is(err, errRestarted) {
			if err := f.reset(ctx, "restart"); err != nil {
				return err
			}
			continue
		}
		return err
	}
	return nil
}

func (f *Follower) replayOnce(ctx context.Context) error {
	from := uint64(0)
	if f.have {
		from = uint64(f.last)
	}
	n, first := 0, int64(-1)
	err := f.replay(ctx, from, func(b kvevents.Batch) error {
		if b.Seq > math.MaxInt64 {
			return nil
		}
		s := int64(b.Seq)
		n++
		if first < 0 {
			first = s
			switch {
			case f.have && s == f.last:
				if f.digest != 0 && b.Digest != f.digest {
					return errRestarted
				}
			case f.have && s > f.last+1, !f.have && s > 0:
				// The buffer no longer reaches back: what is missing
				// cannot be recovered; start over from what is there.
				f.m.replays.WithLabelValues("short").Inc()
				f.log.Info("replay buffer too short", "want", from, "first", s)
				if f.have {
					if err := f.reset(ctx, "short_replay"); err != nil {
						return err
					}
				}
			}
		}
		f.replayedTo = max(f.replayedTo, s)
		if f.have && s <= f.last {
			return nil
		}
		if f.have && s != f.last+1 {
			// A hole inside the replay itself: the buffer is not
			// contiguous, which only a restart mid-replay explains.
			return errRestarted
		}
		return f.apply(ctx, b)
	})
	if err != nil {
		if !errors.Is(err, errRestarted) {
			f.m.replays.WithLabelValues("error").Inc()
		}
		return err
	}
	f.m.replays.WithLabelValues("ok").Inc()
	f.m.replayedBatches.Add(float64(n))
	if n == 0 && f.have {
		// The batch at last has left a buffer that holds nothing newer:
		// the publisher's counter went back, the replica restarted.
		return errRestarted
	}
	return nil
}

// relearn rebuilds the replica's entries after a run found that the store
// had lost them (lost; nothing to do otherwise): without it the index would
// know only what the stream brought since, for as long as the replica
// lives. The partial entries are cleared and the replay buffer applied from
// its start, as after a restart. A replica without a replay socket keeps
// what the stream brought: nothing could rebuild more.
func (f *Follower) relearn(ctx context.Context) error {
	if !f.lost || f.fenced {
		return nil
	}
	if f.replay == nil {
		f.lost = false
		f.log.Warn("the store lost the replica's index entries; without a replay socket only what the stream brings from now on is indexed", "applied", f.last)
		f.m.replays.WithLabelValues("unavailable").Inc()
		return nil
	}
	f.log.Warn("the store lost the replica's index entries; rebuilding them from the replay buffer", "applied", f.last)
	if err := f.reset(ctx, "store_lost"); err != nil {
		// Still lost: the next batch tries again.
		return err
	}
	f.lost = false
	if err := f.catchUp(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if f.fenced {
			return err
		}
		// As on connect: the live stream's seq check notices what is
		// still missing and replays again.
		f.log.Warn("replay after the store lost the replica", "err", err)
	}
	return nil
}

// refill replays what the store lost of the replica's history after a run
// was refused as behind (nothing to do otherwise): the store's applied seq
// is read again and the replay buffer applied from it, the refused run
// included, so that a quiet replica's last batches are not missing until
// its next one. Without a replay socket nothing can refill the hole: the
// replica is cleared and rebuilt from the live stream, as after a gap.
func (f *Follower) refill(ctx context.Context) error {
	if !f.behind || f.fenced {
		return nil
	}
	f.behind = false
	f.m.gaps.Inc()
	f.log.Warn("the store lost batches it had applied for the replica (a failover, or its AOF's last second): replaying them", "applied", f.last)
	if err := f.readSeq(ctx); err != nil {
		f.behind = true
		return err
	}
	if f.replay == nil {
		return f.reset(ctx, "gap")
	}
	if err := f.catchUp(ctx); err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		// The live stream's seq check notices what is still missing.
		f.log.Warn("replay after the store lost batches", "err", err)
	}
	return nil
}

func (f *Follower) reset(ctx context.Context, reason string) error {
	if f.fenced {
		return errFenced
	}
	if err := f.st.ResetReplica(ctx, f.rep.Model, f.rep.ID, f.writer); err != nil {
		f.synced = false
		f.fence(err)
		return fmt.Errorf("reset replica: %w", err)
	}
	f.m.resets.WithLabelValues(reason).Inc()
	f.tr.Reset()
	f.have, f.last, f.digest, f.replayedTo, f.verified = false, -1, 0, -1, true
	return nil
}

// maxRunOps bounds the operations HandleBatches applies with one store
// call: the script blocks Redis, routing lookups included, while it runs, at
// about 6 µs a block here. 256 keeps that near 1.5 ms; 1,024 ingested no
// faster in the benchmark and blocked for 6 ms.
const maxRunOps = 256

// HandleBatches handles live batches in order, as Handle would one after
// the other, except that the batches that simply continue the stream (each
// the seq after the last applied, which Handle would apply right away) are
// applied together, up to maxRunOps operations per store call. The caller
// passes what is already queued, so nothing waits to be batched: an
// ingestor that keeps up applies batch by batch, one that fell behind
// catches up in a few round trips.
func (f *Follower) HandleBatches(ctx context.Context, bs []kvevents.Batch) error {
	var errs []error
	for len(bs) > 0 && !f.fenced {
		n, err := f.applyRun(ctx, bs)
		if n == 0 {
			n, err = 1, f.handle(ctx, bs[0])
		}
		if err != nil {
			errs = append(errs, err)
		}
		if err := f.relearn(ctx); err != nil {
			errs = append(errs, err)
		}
		if err := f.refill(ctx); err != nil {
			errs = append(errs, err)
		}
		bs = bs[n:]
	}
	return errors.Join(errs...)
}

// applyRun applies the leading batches of bs that continue the stream with
// one store call and returns how many batches it consumed: 0 when bs[0]
// does not continue the stream (Handle must decide); else every continuing
// batch up to the op bound, or up to the first that needs a store lookup to
// be translated (that lookup must see the batches before it applied); on an
// error, the batches up to the one that failed, as Handle would have
// consumed them, so that the rest go through Handle, which re-reads the
// store first.
func (f *Follower) applyRun(ctx context.Context, bs []kvevents.Batch) (int, error) {
	next := int64(0)
	if f.have {
		next = f.last + 1
	}
	if !f.synced || next <= f.liveSeq || bs[0].Seq != uint64(next) {
		return 0, nil
	}
	f.ops, f.run = f.ops[:0], f.run[:0]
	for i := range bs {
		b := &bs[i]
		if b.Seq != uint64(next) || len(f.ops) >= maxRunOps {
			break
		}
		want := f.tr.missing(b.Events)
		if len(want) > 0 && len(f.run) > 0 {
			break
		}
		if err := f.tr.fetch(ctx, want); err != nil {
			// Only the first batch of a run can need a lookup.
			f.liveSeq = next
			f.countSkipped(b.Skipped)
			f.synced = false
			return 1, fmt.Errorf("translate seq %d: %w", b.Seq, err)
		}
		var st TranslateStats
		f.ops, st = f.tr.appendOps(f.ops, b.Events)
		f.run = append(f.run, pending{b: b, end: len(f.ops), st: st})
		next++
	}
	n, err := f.store(ctx)
	for _, p := range f.run[:n] {
		f.countSkipped(p.b.Skipped)
	}
	f.liveSeq = int64(f.run[n-1].b.Seq)
	clear(f.run) // let the batches go
	return n, err
}

// apply translates and applies one batch as one store call.
func (f *Follower) apply(ctx context.Context, b kvevents.Batch) error {
	if f.fenced {
		return errFenced
	}
	f.countSkipped(b.Skipped)
	if err := f.tr.fetch(ctx, f.tr.missing(b.Events)); err != nil {
		f.synced = false
		return fmt.Errorf("translate seq %d: %w", b.Seq, err)
	}
	var st TranslateStats
	f.ops, st = f.tr.appendOps(f.ops[:0], b.Events)
	f.run = append(f.run[:0], pending{b: &b, end: len(f.ops), st: st})
	_, err := f.store(ctx)
	clear(f.run)
	return err
}

// countSkipped counts what decoding or translating a batch skipped, by
// reason.
func (f *Follower) countSkipped(skipped map[string]int) {
	for reason, n := range skipped {
		f.m.skipped.WithLabelValues(reason).Add(float64(n))
	}
}

// store applies the translated batches in f.run, consecutive seqs, with one
// store call, and accounts for each as if applied on its own. When the store
// already holds part of a run (another ingestor got there first), the run
// changed nothing and its batches are applied one by one instead, so that
// exactly the stale ones are no-ops. It returns how many batches it
// consumed: all, or on an error those settled and the one that failed.
func (f *Follower) store(ctx context.Context) (int, error) {
	run := f.run
	first, last := int64(run[0].b.Seq), int64(run[len(run)-1].b.Seq)
	res, err := f.st.ApplyRun(ctx, f.rep.Model, f.rep.ID, f.writer, first, last, f.ops[:run[len(run)-1].end])
	if err != nil {
		// The store is the truth: re-read it before the next batch.
		if f.failed(first, err) {
			return len(run), nil // refill replays the run
		}
		return 1, fmt.Errorf("apply seq %d: %w", first, err)
	}
	if res.Applied || len(run) == 1 {
		f.account(run, res)
		return len(run), nil
	}
	from := 0
	for i := range run {
		p := &run[i]
		seq := int64(p.b.Seq)
		res, err := f.st.ApplyRun(ctx, f.rep.Model, f.rep.ID, f.writer, seq, seq, f.ops[from:p.end])
		if err != nil {
			if f.failed(seq, err) {
				return len(run), nil
			}
			return i + 1, fmt.Errorf("apply seq %d: %w", seq, err)
		}
		f.account(run[i:i+1], res)
		from = p.end
	}
	return len(run), nil
}

// failed notes an apply of a run from first that returned err: the store
// must be re-read before the next batch, and when the run continued the
// follower's history, readSeq checks whether it found the store had lost
// it. A refused writer is fenced. It reports whether the store was behind
// (it lost acknowledged batches): then refill replays the run, which is
// no error of the caller's.
func (f *Follower) failed(first int64, err error) bool {
	f.synced = false
	f.fence(err)
	if errors.Is(err, kvroute.ErrStoreBehind) {
		f.behind = true
		return true
	}
	if f.have && first == f.last+1 && !f.fenced {
		f.failedFirst = first
	}
	return false
}

// account records the metrics of batches applied together with result res,
// and the last one as the applied seq.
func (f *Follower) account(run []pending, res kvroute.ApplyResult) {
	for i := range run {
		st := &run[i].st
		f.countSkipped(st.Skipped)
		f.m.orphans.Add(float64(st.Orphans))
		f.m.clears.Add(float64(st.Clears))
	}
	b := run[len(run)-1].b
	if res.NoPrior && f.have {
		f.lost = true
	}
	f.last, f.have, f.digest = int64(b.Seq), true, b.Digest
	if !res.Applied {
		// The store already holds this seq or a newer one: another
		// ingestor following the same stream got there first.
		f.m.batches.WithLabelValues("not_applied").Add(float64(len(run)))
		return
	}
	f.m.batches.WithLabelValues("applied").Add(float64(len(run)))
	f.m.replicaBatches.WithLabelValues(f.rep.ID).Add(float64(len(run)))
	f.m.replicaApplied.WithLabelValues(f.rep.ID).Set(float64(f.now().UnixNano()) / 1e9)
	f.m.stored.Add(float64(res.Stored))
	f.m.removed.Add(float64(res.Removed))
	f.m.unknownRemovals.Add(float64(res.Unknown))
	now := f.now()
	for i := range run {
		if ts := run[i].b.TS; ts > 0 {
			lag := now.Sub(time.Unix(0, int64(ts*1e9))).Seconds()
			f.m.lag.Observe(max(lag, 0))
		}
	}
}
