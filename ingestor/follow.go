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
