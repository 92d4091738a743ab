package ingestor

// Recovering a replica's history in the store: a gap replayed from the
// replica's buffer, a restart or a short buffer cleared and rebuilt, and
// what the store itself lost (its entries, or batches it had acknowledged)
// applied again.

import (
	"context"
	"errors"
	"fmt"
	"math"

	"github.com/kvroute/kvroute/ingestor/kvevents"
)

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
