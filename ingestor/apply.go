package ingestor

// Applying batches to the store: runs of consecutive batches in one store
// call, each batch accounted for as if applied on its own, and a failed or
// refused call turned into what the follower must do next.

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor/kvevents"
)

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
