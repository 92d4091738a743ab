package ingestor

// Following the registry: the poll that reads it (and the store's epoch)
// and starts, restarts and stops followers to match, and the rebuild
// after the store lost its data.

import (
	"context"
	"time"

	"github.com/kvroute/kvroute"
)

// resetGrace is how long after the store lost its data an ingestor keeps
// following the replicas it followed although the registry no longer
// lists them, and polls fast until each is re-seeded and marked followed
// again: an empty registry that appears suddenly is not the truth, and
// the serving pods write theirs back within a second or so (the router's
// reset window is as long).
const resetGrace = 15 * time.Second

// fastPoll is the registry poll's interval while the ingestor waits for a
// re-seeded registry to mark its rebuilt replicas followed in.
const fastPoll = 50 * time.Millisecond

// pollLoop polls the registry and the epoch until ctx is done: every
// RegistryInterval, or every fastPoll while a rebuild after a store loss
// waits for the registry (rebuilding).
func (in *Ingestor) pollLoop(ctx context.Context) {
	t := time.NewTimer(in.c.RegistryInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		in.poll(ctx)
		every := in.c.RegistryInterval
		if in.rebuilding() {
			every = min(every, fastPoll)
		}
		t.Reset(every)
	}
}

// rebuilding reports whether a rebuild after a store loss still waits for
// the registry: less than resetGrace ago, and some replica this ingestor
// follows not yet marked followed in it again.
func (in *Ingestor) rebuilding() bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.c.Now().Before(in.graceUntil) && !in.settled
}

// poll is one registry poll: the store's epoch checked, the registry
// re-read when it moved, and every replica this ingestor has caught up on
// but the registry says nobody follows marked followed again.
func (in *Ingestor) poll(ctx context.Context) {
	// After a change of the global epoch every follower rebuilds: the
	// models' epochs changed with it and are only noted.
	in.checkModelEpochs(ctx, !in.checkEpoch(ctx))
	in.syncRegistry(ctx)
	in.markFollowed(ctx)
}

// checkModelEpochs reads the epoch of every model this ingestor follows
// replicas of and, when rebuild is set, rebuilds the followers of each
// model whose epoch changed: its shard lost its data alone (see
// Store.ModelEpoch). A model read for the first time, or one that could
// not be read, rebuilds nothing.
func (in *Ingestor) checkModelEpochs(ctx context.Context, rebuild bool) {
	in.mu.Lock()
	byModel := map[string][]*worker{}
	for _, o := range in.owned {
		if o.w != nil {
			byModel[o.rep.Model] = append(byModel[o.rep.Model], o.w)
		}
	}
	in.mu.Unlock()
	seen := make(map[string]string, len(byModel))
	for m, ws := range byModel {
		ep, err := in.st.ModelEpoch(ctx, m)
		if err != nil {
			if ctx.Err() == nil {
				in.log.Debug("model epoch", "model", m, "err", err)
			}
			continue
		}
		seen[m] = ep
		in.mu.Lock()
		prev := in.modelEpochs[m]
		in.mu.Unlock()
		if rebuild && prev != "" && prev != ep {
			in.log.Warn("the state store lost the model's data (its epoch changed): rebuilding its followed replicas from their replay buffers", "model", m, "replicas", len(ws))
			for _, w := range ws {
				w.storeReset()
			}
		}
	}
	in.mu.Lock()
	for m, ep := range seen {
		if in.modelEpochs == nil {
			in.modelEpochs = map[string]string{}
		}
		in.modelEpochs[m] = ep
	}
	in.mu.Unlock()
}

// checkEpoch reads the store's epoch and, when it changed, handles the
// loss of the store's data: the registry is re-read whatever its version
// says (versions start again from zero), replicas it no longer lists are
// followed on for resetGrace, and every follower resyncs from its
// replica's replay buffer at once, which finds no applied seq and
// rebuilds the replica's entries. It reports whether the epoch changed
// (or could not be read).
func (in *Ingestor) checkEpoch(ctx context.Context) bool {
	ep, err := in.st.Epoch(ctx)
	if err != nil {
		if ctx.Err() == nil {
			in.log.Debug("epoch", "err", err)
		}
		return true
	}
	in.mu.Lock()
	prev := in.epoch
	in.epoch = ep
	changed := prev != "" && prev != ep
	var ws []*worker
	if changed {
		in.read, in.settled = false, false
		in.graceUntil = in.c.Now().Add(resetGrace)
		for _, o := range in.owned {
			if o.w != nil {
				ws = append(ws, o.w)
			}
		}
	}
	in.mu.Unlock()
	if !changed {
		return false
	}
	in.log.Warn("the state store lost its data (its epoch changed): rebuilding every followed replica from its replay buffer", "replicas", len(ws))
	for _, w := range ws {
		w.storeReset()
	}
	return true
}

// markFollowed marks followed again every replica whose stream this
// ingestor has caught up on since the store last lost its data, when the
// registry lists it as followed by nobody: a registry re-seeded after a
// loss (written without followed_since), or another ingestor that gave
// the replica up after this one took it over. Decisions would otherwise
// say its index is incomplete until the next reconnection.
func (in *Ingestor) markFollowed(ctx context.Context) {
	var ids []string
	seen := map[string]bool{}
	settled := true
	in.mu.Lock()
	for id, o := range in.owned {
		r, listed := in.replicas[id]
		listed = listed && !in.kept[id]
		if o.w == nil {
			continue
		}
		caught := o.w.caughtUp()
		if !caught || !listed {
			settled = false
		}
		sid := kvroute.ServerID(id)
		if caught && listed && r.FollowedSince.IsZero() && !seen[sid] {
			seen[sid] = true
			ids = append(ids, sid)
		}
	}
	in.settled = settled
	in.mu.Unlock()
	// The registry was read after the epoch: a store that lost its data
	// since would list re-seeded replicas this ingestor has not rebuilt.
	if len(ids) == 0 || in.checkEpoch(ctx) {
		return
	}
	for _, id := range ids {
		if err := in.st.SetFollowed(ctx, id, in.c.Now()); err != nil && ctx.Err() == nil {
			in.log.Debug("record followed", "replica", id, "err", err)
		}
	}
}

// syncRegistry re-reads the registry when its version changed: new
// replicas are picked up by the next lease round, changed ones restart
// their worker, deleted ones are stopped and purged.
func (in *Ingestor) syncRegistry(ctx context.Context) {
	v, err := in.st.RegistryVersion(ctx)
	if err != nil {
		in.log.Warn("registry version", "err", err)
		return
	}
	in.mu.Lock()
	// Replicas followed on after a loss are dropped at the grace's end,
	// whatever the version says.
	same := in.read && v == in.version && (len(in.kept) == 0 || in.c.Now().Before(in.graceUntil))
	in.mu.Unlock()
	if same {
		return
	}
	reps, err := in.st.ListReplicas(ctx)
	if err != nil {
		in.log.Warn("list replicas", "err", err)
		return
	}
	next := make(map[string]kvroute.Replica, len(reps))
	for _, r := range reps {
		// A data-parallel replica is followed engine by engine, each
		// its own stream, cache and lease; its health and metrics are
		// the server's, read once (health.go).
		for _, e := range r.Engines() {
			next[e.ID] = e
		}
	}
	var gone, changed []*owned
	in.mu.Lock()
	in.keepMissing(next)
	in.replicas, in.version, in.read = next, v, true
	for id, o := range in.owned {
		r, ok := next[id]
		switch {
		case !ok:
			gone = append(gone, o)
			delete(in.owned, id)
		case streamChanged(o.rep, r):
			changed = append(changed, o)
			delete(in.owned, id)
		default:
			o.rep = r
		}
	}
	in.mu.Unlock()
	in.dropGone(ctx, gone)
	in.stopChanged(ctx, changed, next)
	in.mu.Lock()
	unowned := false
	for id := range next {
		if in.owned[id] == nil {
			unowned = true
			break
		}
	}
	in.mu.Unlock()
	if len(changed) > 0 || unowned {
		// Restart changed replicas under the lease we still hold, and
		// try for new ones now rather than at the next renewal (up to
		// LeaseTTL/3 away): decisions are cache-blind for a replica
		// nobody follows, so following must start within a registry
		// poll of its registration.
		in.renewLeases(ctx)
	}
	in.m.owned.Set(float64(len(in.Owned())))
}

// keepMissing adds to next, a registry read, the replicas followed before
// that it does not list, while the grace after a store loss lasts: the
// registry is being re-seeded. The caller holds in.mu.
func (in *Ingestor) keepMissing(next map[string]kvroute.Replica) {
	in.kept = nil
	if !in.c.Now().Before(in.graceUntil) {
		return
	}
	for id, r := range in.replicas {
		if _, ok := next[id]; !ok && in.owned[id] != nil {
			if in.kept == nil {
				in.kept = map[string]bool{}
			}
			next[id], in.kept[id] = r, true
		}
	}
}

// dropGone stops following replicas deleted from the registry and purges
// what the store keeps of them, leases included.
func (in *Ingestor) dropGone(ctx context.Context, gone []*owned) {
	for _, o := range gone {
		in.log.Info("replica deleted", "replica", o.rep.ID)
		in.stopWorker(o, true)
		if err := in.st.PurgeReplica(ctx, o.rep.Model, o.rep.ID); err != nil {
			in.log.Warn("purge deleted replica", "replica", o.rep.ID, "err", err)
		} else {
			in.m.purges.Inc()
		}
		if err := in.st.ReleaseOwnership(ctx, leaseName(o.rep.ID), in.c.Owner); err != nil {
			in.log.Warn("release lease", "replica", o.rep.ID, "err", err)
		}
	}
}

// stopChanged stops the workers of replicas whose stream changed, so that
// the next lease round restarts them on the new one; a replica that moved
// to another model has its old model's entries purged.
func (in *Ingestor) stopChanged(ctx context.Context, changed []*owned, next map[string]kvroute.Replica) {
	for _, o := range changed {
		in.log.Info("replica changed", "replica", o.rep.ID)
		in.stopWorker(o, true)
		if o.rep.Model != next[o.rep.ID].Model {
			// Its entries live under the old model's keys: nobody will
			// ever look them up again.
			if err := in.st.PurgeReplica(ctx, o.rep.Model, o.rep.ID); err != nil {
				in.log.Warn("purge moved replica", "replica", o.rep.ID, "err", err)
			}
		}
	}
}

// streamChanged reports whether r's worker must restart to follow r2.
func streamChanged(r, r2 kvroute.Replica) bool {
	return r.Model != r2.Model || r.Events != r2.Events || r.Replay != r2.Replay || r.Topic != r2.Topic
}
