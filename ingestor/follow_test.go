package ingestor_test

import (
	"errors"
	"reflect"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/ingestor/internal/wire"
	"github.com/kvroute/kvroute/ingestor/kvevents"
	"github.com/kvroute/kvroute/internal/telemetry"
	"github.com/prometheus/client_golang/prometheus"
)

const tModel, tRep = "m", "r1"

type followFixture struct {
	st      *fakeStore
	pub     *fakePub
	f       *ingestor.Follower
	replays int
}

func newFollow(t *testing.T, withReplay bool, bufSize int) *followFixture {
	t.Helper()
	fx := &followFixture{st: newFakeStore(), pub: &fakePub{tb: t, topic: "kv", bufSize: bufSize}}
	fx.newFollower(t, withReplay)
	return fx
}

// newFollower replaces the follower, as a restarted ingestor would.
func (fx *followFixture) newFollower(t *testing.T, withReplay bool) {
	t.Helper()
	c := ingestor.FollowerConfig{Replica: kvroute.Replica{ID: tRep, Model: tModel}, Store: fx.st}
	if withReplay {
		c.Replay = fx.pub.replay(&fx.replays)
	}
	fx.f = ingestor.NewFollower(c)
}

func (fx *followFixture) live(t *testing.T, frames [][]byte) {
	t.Helper()
	b, err := kvevents.Decode(frames)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if err := fx.f.Handle(t.Context(), b); err != nil {
		t.Fatalf("Handle seq %d: %v", b.Seq, err)
	}
}

// block publishes one batch storing one block, chained on the previous
// batch's block (the first of a publisher's life starts a prompt).
func (fx *followFixture) block() [][]byte {
	s := fx.pub.seq
	var parent any
	if s > 0 {
		parent = 1000*fx.pub.epoch + int(s) - 1
	}
	return fx.pub.next(wire.Stored([]any{1000*fx.pub.epoch + int(s)}, parent, wire.Tokens(int(s)*4, 4), 4))
}

func (fx *followFixture) wantApplied(t *testing.T, want ...int64) {
	t.Helper()
	if got := fx.st.appliedSeqs(tModel, tRep); !reflect.DeepEqual(got, want) {
		t.Errorf("applied seqs: got %v, want %v", got, want)
	}
}

func (fx *followFixture) wantResets(t *testing.T, want int) {
	t.Helper()
	fx.st.mu.Lock()
	got := fx.st.resets[tModel+"/"+tRep]
	fx.st.mu.Unlock()
	if got != want {
		t.Errorf("resets: got %d, want %d", got, want)
	}
}

// wantHeld checks the replica holds exactly the keys of blocks
// from..from+n-1 of the one chained prompt the fixture publishes.
func (fx *followFixture) wantHeld(t *testing.T, from, n int) {
	t.Helper()
	all := kvroute.BlockKeys(kvroute.KeySpace{Model: tModel}, 4, wire.UTokens(0, 4*(from+n)), nil)
	want := map[kvroute.BlockKey]bool{}
	for _, k := range all[from:] {
		want[k] = true
	}
	got := fx.st.heldKeys(tModel, tRep)
	if len(got) != len(want) {
		t.Fatalf("held %d keys, want %d", len(got), len(want))
	}
	for _, k := range got {
		if !want[k] {
			t.Errorf("held key %v, want only the keys of blocks %d..%d", k, from, from+n-1)
		}
	}
}

func TestFollowerSequencing(t *testing.T) {
	t.Run("in order", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		for range 4 {
			fx.live(t, fx.block())
		}
		fx.wantApplied(t, 0, 1, 2, 3)
		fx.wantResets(t, 0)
		fx.wantHeld(t, 0, 4)
		if fx.replays != 0 {
			t.Errorf("replays: got %d, want 0", fx.replays)
		}
	})

	for _, old := range []bool{false, true} {
		name := "gap is replayed (current reply layout)"
		if old {
			name = "gap is replayed (reply layout before #45177)"
		}
		t.Run(name, func(t *testing.T) {
			fx := newFollow(t, true, 0)
			fx.pub.oldLayout = old
			fx.live(t, fx.block())
			fx.live(t, fx.block())
			fx.block() // lost
			fx.block() // lost
			b4 := fx.block()
			b5 := fx.block()
			fx.live(t, b4) // gap: replays 2..5
			fx.live(t, b5) // duplicate of the replay: not applied twice
			fx.live(t, fx.block())
			fx.wantApplied(t, 0, 1, 2, 3, 4, 5, 6)
			fx.wantResets(t, 0)
			fx.wantHeld(t, 0, 7)
		})
	}

	t.Run("restart (seq back) resets and rebuilds", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		for range 3 {
			fx.live(t, fx.block())
		}
		fx.pub.restart()
		fx.live(t, fx.block())
		fx.live(t, fx.block())
		fx.wantApplied(t, 0, 1, 2, 0, 1)
		fx.wantResets(t, 1)
		// Only the new process's blocks (hashes 1000+) remain; same tokens
		// as before, so the same keys.
		fx.wantHeld(t, 0, 2)
	})

	t.Run("restart missed while away: first live seq after reconnect is old", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		for range 3 {
			fx.live(t, fx.block())
		}
		fx.pub.restart()
		fx.block() // seq 0 of the new process, published while disconnected
		fx.block()
		if err := fx.f.Sync(t.Context()); err != nil { // reconnect
			t.Fatal(err)
		}
		fx.live(t, fx.block())
		fx.wantApplied(t, 0, 1, 2, 0, 1, 2)
		fx.wantResets(t, 1)
		fx.wantHeld(t, 0, 3)
	})

	t.Run("replay buffer too short resets and rebuilds from it", func(t *testing.T) {
		fx := newFollow(t, true, 2)
		fx.live(t, fx.block())
		for range 3 {
			fx.block() // lost; the buffer keeps only the last 2
		}
		fx.live(t, fx.block()) // seq 4; buffer holds 3, 4
		fx.wantApplied(t, 0, 3, 4)
		fx.wantResets(t, 1)
	})

	t.Run("no replay endpoint: a gap resets and rebuilds from the live stream", func(t *testing.T) {
		fx := newFollow(t, false, 0)
		fx.live(t, fx.block())
		fx.block() // lost
		fx.live(t, fx.block())
		fx.live(t, fx.block())
		fx.wantApplied(t, 0, 2, 3)
		fx.wantResets(t, 1)
	})

	t.Run("joining mid-stream replays the buffer from 0", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		for range 3 {
			fx.block() // published before anyone listened
		}
		fx.live(t, fx.block())
		fx.wantApplied(t, 0, 1, 2, 3)
		fx.wantResets(t, 0)
		fx.wantHeld(t, 0, 4)
	})

	t.Run("sync on connect catches up from the stored seq", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		fx.live(t, fx.block())
		fx.live(t, fx.block())
		fx.block()
		fx.block()
		fx.newFollower(t, true) // an ingestor restart: no digest in memory
		if err := fx.f.Sync(t.Context()); err != nil {
			t.Fatal(err)
		}
		fx.wantApplied(t, 0, 1, 2, 3)
		fx.live(t, fx.block())
		fx.wantApplied(t, 4)
		fx.wantResets(t, 0)
		fx.wantHeld(t, 0, 5)
	})

	t.Run("sync notices a restart by an empty or different buffer", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		for range 4 {
			fx.live(t, fx.block())
		}
		fx.pub.restart()
		fx.block()
		fx.block()
		if err := fx.f.Sync(t.Context()); err != nil {
			t.Fatal(err)
		}
		fx.wantApplied(t, 0, 1, 2, 3, 0, 1)
		fx.wantResets(t, 1)
		fx.wantHeld(t, 0, 2)

		// Restart again and get as far as the old seq: only the digest
		// of the batch at the applied seq tells the processes apart.
		fx.pub.restart()
		for range 3 {
			fx.block()
		}
		if err := fx.f.Sync(t.Context()); err != nil {
			t.Fatal(err)
		}
		fx.wantApplied(t, 0, 1, 2)
		fx.wantResets(t, 2)
	})

	t.Run("two ingestors overlapping during a takeover apply each batch once", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		fx.live(t, fx.block())
		var replays int
		other := ingestor.NewFollower(ingestor.FollowerConfig{
			Replica: kvroute.Replica{ID: tRep, Model: tModel}, Store: fx.st, Replay: fx.pub.replay(&replays)})
		if err := other.Sync(t.Context()); err != nil {
			t.Fatal(err)
		}
		for range 3 {
			f := fx.block()
			fx.live(t, f)
			b, _ := kvevents.Decode(f)
			if err := other.Handle(t.Context(), b); err != nil {
				t.Fatal(err)
			}
		}
		fx.wantApplied(t, 0, 1, 2, 3)
		fx.wantResets(t, 0)
	})

	t.Run("no replay endpoint: seq at or below the applied one after reconnect is a restart", func(t *testing.T) {
		fx := newFollow(t, false, 0)
		fx.live(t, fx.block())
		fx.live(t, fx.block())
		fx.newFollower(t, false)
		if err := fx.f.Sync(t.Context()); err != nil {
			t.Fatal(err)
		}
		fx.pub.restart()
		fx.live(t, fx.block())
		fx.wantApplied(t, 0, 1, 0)
		fx.wantResets(t, 1)
	})

	t.Run("store outage: the batch is retried through resync", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		fx.live(t, fx.block())
		fx.st.failNext = 1
		b, _ := kvevents.Decode(fx.block())
		if err := fx.f.Handle(t.Context(), b); err == nil {
			t.Fatal("Handle: got nil error during outage")
		}
		fx.live(t, fx.block()) // seq 2: resync sees applied 0, replays 1..2
		fx.wantApplied(t, 0, 1, 2)
		fx.wantResets(t, 0)
	})
}

// TestFollowerStoreLost: the store loses a replica's entries under a
// follower that had applied its stream (a Cluster shard that came back
// empty, while the registry's shard kept the replica registered). The next
// run applied finds no applied seq; without a rebuild the index would know
// only what the stream brought since.
func TestFollowerStoreLost(t *testing.T) {
	withMetrics := func(fx *followFixture, withReplay bool) *prometheus.Registry {
		reg := prometheus.NewRegistry()
		m := newMetrics(t, reg)
		c := ingestor.FollowerConfig{Replica: kvroute.Replica{ID: tRep, Model: tModel}, Store: fx.st, Metrics: m}
		if withReplay {
			c.Replay = fx.pub.replay(&fx.replays)
		}
		fx.f = ingestor.NewFollower(c)
		return reg
	}
	t.Run("a live batch after the loss rebuilds from the replay buffer", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		reg := withMetrics(fx, true)
		for range 3 {
			fx.live(t, fx.block())
		}
		fx.st.lose(tModel, tRep)
		fx.live(t, fx.block())
		fx.wantApplied(t, 0, 1, 2, 3, 0, 1, 2, 3)
		fx.wantResets(t, 1)
		fx.wantHeld(t, 0, 4)
		if got := metric(t, reg, "kvroute_ingest_resets_total", "reason=store_lost"); got != 1 {
			t.Errorf("store_lost resets: got %v, want 1", got)
		}
		fx.live(t, fx.block())
		fx.wantApplied(t, 4)
		fx.wantHeld(t, 0, 5)
	})
	t.Run("a queued run after the loss rebuilds from the replay buffer", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		withMetrics(fx, true)
		fx.live(t, fx.block())
		fx.live(t, fx.block())
		fx.st.lose(tModel, tRep)
		fx.handleAll(t, fx.block(), fx.block(), fx.block())
		fx.wantApplied(t, 0, 1, 2, 3, 4, 0, 1, 2, 3, 4)
		fx.wantResets(t, 1)
		fx.wantHeld(t, 0, 5)
	})
	t.Run("no replay endpoint: what the stream brings is kept", func(t *testing.T) {
		fx := newFollow(t, false, 0)
		reg := withMetrics(fx, false)
		for range 3 {
			fx.live(t, fx.block())
		}
		fx.st.lose(tModel, tRep)
		fx.live(t, fx.block())
		fx.live(t, fx.block())
		fx.wantApplied(t, 0, 1, 2, 3, 4)
		fx.wantResets(t, 0)
		fx.wantHeld(t, 3, 2)
		if got := metric(t, reg, "kvroute_ingest_replays_total", "result=unavailable"); got != 1 {
			t.Errorf("unavailable replays: got %v, want 1", got)
		}
	})
	// A store call fails once on the way; the next batch must still end
	// with the whole stream indexed, rebuilt only when the data was lost.
	for _, tc := range []struct {
		name   string
		lost   bool
		fail   func(*fakeStore)
		resets int
	}{
		{"the reset that would rebuild fails: the next batch tries again", true, func(s *fakeStore) { s.failReset = 1 }, 1},
		{"the reply that said so is lost: the store's history start tells", true, func(s *fakeStore) { s.failAfter = 1 }, 1},
		{"a lost reply over a store that kept its data is no loss", false, func(s *fakeStore) { s.failAfter = 1 }, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFollow(t, true, 0)
			for range 3 {
				fx.live(t, fx.block())
			}
			if tc.lost {
				fx.st.lose(tModel, tRep)
			}
			tc.fail(fx.st)
			b, _ := kvevents.Decode(fx.block())
			if err := fx.f.Handle(t.Context(), b); err == nil {
				t.Fatal("Handle: got nil error from a failed store call")
			}
			fx.live(t, fx.block())
			if !tc.lost {
				fx.wantApplied(t, 0, 1, 2, 3, 4)
			}
			fx.wantResets(t, tc.resets)
			fx.wantHeld(t, 0, 5)
		})
	}
	t.Run("the reply that said so is lost, then the stream reconnects: one replay from the start", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		for range 3 {
			fx.live(t, fx.block())
		}
		fx.st.lose(tModel, tRep)
		fx.st.failAfter = 1
		b, _ := kvevents.Decode(fx.block())
		if err := fx.f.Handle(t.Context(), b); err == nil {
			t.Fatal("Handle: got nil error from a lost reply")
		}
		fx.replays = 0
		if err := fx.f.Sync(t.Context()); err != nil {
			t.Fatal(err)
		}
		fx.wantResets(t, 1)
		fx.wantHeld(t, 0, 4)
		if fx.replays != 1 {
			t.Errorf("replays: got %d, want 1 (from the start, not first from the stale seq)", fx.replays)
		}
	})
	t.Run("a follower that never applied takes an empty store for its start", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		fx.live(t, fx.block())
		fx.live(t, fx.block())
		fx.wantApplied(t, 0, 1)
		fx.wantResets(t, 0)
		if fx.replays != 0 {
			t.Errorf("replays: got %d, want 0", fx.replays)
		}
	})
}

// decodeAll decodes live messages as a worker does before handing them to
// the follower together.
func decodeAll(t *testing.T, msgs ...[][]byte) []kvevents.Batch {
	t.Helper()
	bs := make([]kvevents.Batch, len(msgs))
	for i, m := range msgs {
		b, err := kvevents.Decode(m)
		if err != nil {
			t.Fatalf("Decode: %v", err)
		}
		bs[i] = b
	}
	return bs
}

func (fx *followFixture) handleAll(t *testing.T, msgs ...[][]byte) {
	t.Helper()
	if err := fx.f.HandleBatches(t.Context(), decodeAll(t, msgs...)); err != nil {
		t.Fatalf("HandleBatches: %v", err)
	}
}

func (fx *followFixture) wantCalls(t *testing.T, want int) {
	t.Helper()
	fx.st.mu.Lock()
	got := fx.st.calls[tModel+"/"+tRep]
	fx.st.calls[tModel+"/"+tRep] = 0
	fx.st.mu.Unlock()
	if got != want {
		t.Errorf("store calls: got %d, want %d", got, want)
	}
}

// newMetrics is the ingestor's instruments exported into reg, as the
// wiring exports them.
func newMetrics(t *testing.T, reg *prometheus.Registry) *ingestor.Metrics {
	t.Helper()
	mp, err := telemetry.NewMeterProvider(reg)
	if err != nil {
		t.Fatal(err)
	}
	m, err := ingestor.NewMetrics(mp)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// metric sums the samples of the named metric (histograms: their counts)
// whose labels include label (name=value; "" matches all).
func metric(t *testing.T, reg *prometheus.Registry, name, label string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			match := label == ""
			for _, lp := range m.GetLabel() {
				match = match || lp.GetName()+"="+lp.GetValue() == label
			}
			if match {
				sum += m.GetCounter().GetValue() + float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return sum
}

// TestFollowerHandleBatches: queued batches are handled as Handle would
// one by one, with the ones that continue the stream applied together.
func TestFollowerHandleBatches(t *testing.T) {
	t.Run("a queue continuing the stream is one store call, each batch counted", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		reg := prometheus.NewRegistry()
		m := newMetrics(t, reg)
		fx.f = ingestor.NewFollower(ingestor.FollowerConfig{Replica: kvroute.Replica{ID: tRep, Model: tModel},
			Store: fx.st, Replay: fx.pub.replay(&fx.replays), Metrics: m})
		fx.live(t, fx.block())
		fx.wantCalls(t, 1)
		var msgs [][][]byte
		for range 5 {
			msgs = append(msgs, fx.block())
		}
		fx.handleAll(t, msgs...)
		fx.wantCalls(t, 1)
		fx.wantApplied(t, 0, 1, 2, 3, 4, 5)
		fx.wantHeld(t, 0, 6)
		if got := metric(t, reg, "kvroute_ingest_batches_total", "result=applied"); got != 6 {
			t.Errorf("applied batches: got %v, want 6", got)
		}
		if got := metric(t, reg, "kvroute_ingest_blocks_stored_total", ""); got != 6 {
			t.Errorf("stored blocks: got %v, want 6", got)
		}
		if got := metric(t, reg, "kvroute_ingest_apply_lag_seconds", ""); got != 5 {
			t.Errorf("lag observations: got %v, want 5 (seq 0 has no ts)", got)
		}
		if fx.replays != 0 {
			t.Errorf("replays: got %d, want 0", fx.replays)
		}
	})

	t.Run("a gap in the queue is replayed, what follows still applied once", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		b0, b1 := fx.block(), fx.block()
		fx.block() // lost
		b3, b4, b5 := fx.block(), fx.block(), fx.block()
		fx.handleAll(t, b0, b1, b3, b4, b5) // 3 replays 1..5; 4 and 5 are duplicates
		fx.wantApplied(t, 0, 1, 2, 3, 4, 5)
		fx.wantResets(t, 0)
		fx.wantHeld(t, 0, 6)
		if fx.replays != 1 {
			t.Errorf("replays: got %d, want 1", fx.replays)
		}
	})

	t.Run("a restart in the queue resets and rebuilds", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		b0, b1, b2 := fx.block(), fx.block(), fx.block()
		fx.pub.restart()
		c0, c1 := fx.block(), fx.block()
		fx.handleAll(t, b0, b1, b2, c0, c1)
		fx.wantApplied(t, 0, 1, 2, 0, 1)
		fx.wantResets(t, 1)
		fx.wantHeld(t, 0, 2)
	})

	t.Run("another ingestor applied part of the run: each batch applied once", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		fx.live(t, fx.block())
		var msgs [][][]byte
		for range 4 {
			msgs = append(msgs, fx.block())
		}
		other := ingestor.NewFollower(ingestor.FollowerConfig{Replica: kvroute.Replica{ID: tRep, Model: tModel}, Store: fx.st})
		if err := other.Sync(t.Context()); err != nil {
			t.Fatal(err)
		}
		if err := other.HandleBatches(t.Context(), decodeAll(t, msgs[:2]...)); err != nil {
			t.Fatal(err)
		}
		fx.handleAll(t, msgs...)
		fx.wantApplied(t, 0, 1, 2, 3, 4)
		fx.wantResets(t, 0)
		fx.wantHeld(t, 0, 5)
	})

	t.Run("a long queue takes bounded store calls", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		fx.live(t, fx.block())
		fx.wantCalls(t, 1)
		var msgs [][][]byte
		var want []int64
		for i := range 1500 {
			msgs = append(msgs, fx.block())
			want = append(want, int64(i+1))
		}
		fx.handleAll(t, msgs...)
		fx.wantCalls(t, 6) // five calls of 256 one-block batches (maxRunOps), then the rest
		fx.wantApplied(t, append([]int64{0}, want...)...)
	})

	t.Run("store outage in a run: the rest goes through resync", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		fx.live(t, fx.block())
		fx.st.failNext = 1
		bs := decodeAll(t, fx.block(), fx.block(), fx.block())
		if err := fx.f.HandleBatches(t.Context(), bs); err == nil {
			t.Fatal("HandleBatches: got nil error during outage")
		}
		fx.wantApplied(t, 0, 1, 2, 3) // 2 re-reads the store, replays 1..3
		fx.wantResets(t, 0)
		fx.wantHeld(t, 0, 4)
	})

	t.Run("a batch that needs a store lookup waits for the ones before it", func(t *testing.T) {
		fx := newFollow(t, true, 0)
		fx.live(t, fx.block())
		fx.live(t, fx.block())
		fx.newFollower(t, true) // an ingestor restart: nothing cached
		if err := fx.f.Sync(t.Context()); err != nil {
			t.Fatal(err)
		}
		fx.wantCalls(t, 2)
		// Block 2 chains from block 1, which only the store knows: its
		// lookup comes first. A fresh prompt needs none. The offload of
		// block 0 needs the store again, so it waits until the batches
		// before it are applied.
		b2 := fx.block()
		fresh := fx.pub.next(wire.Stored([]any{5000}, nil, wire.Tokens(100, 4), 4))
		offload := fx.pub.next(wire.Stored([]any{0}, nil, []any{}, 0, nil, "CPU"))
		fx.handleAll(t, b2, fresh, offload)
		fx.wantCalls(t, 2)
		fx.wantApplied(t, 0, 1, 2, 3, 4)
		key0 := kvroute.BlockKeys(kvroute.KeySpace{Model: tModel}, 4, wire.UTokens(0, 4), nil)[0]
		fx.st.mu.Lock()
		refs := fx.st.held[tModel+"/"+tRep][key0]
		fx.st.mu.Unlock()
		if refs != 2 {
			t.Errorf("block 0 held %d times, want 2 (GPU and the offloaded copy)", refs)
		}
	})
}

// TestFollowerFenced: two followers of one replica, as during a lease
// handover, where the former owner has not noticed it lost the lease. The
// new owner claimed the replica; the former one then misses a batch and,
// having no replay socket, would clear the replica and start over from the
// batch after the gap. Unfenced, that reset wiped what the new owner had
// applied and the index stayed short of the replica's cache (the chaos
// soak's finding: index 213 blocks, cache 334). Fenced, the store refuses
// the former owner's reset and every later write, and the new owner's
// history stays whole.
func TestFollowerFenced(t *testing.T) {
	fx := newFollow(t, true, 0)
	follower := func(writer string, withReplay bool) *ingestor.Follower {
		c := ingestor.FollowerConfig{Replica: kvroute.Replica{ID: tRep, Model: tModel}, Store: fx.st, Writer: writer}
		if withReplay {
			c.Replay = fx.pub.replay(&fx.replays)
		}
		return ingestor.NewFollower(c)
	}
	ctx := t.Context()
	old, next := follower("ing-a", false), follower("ing-b", true)
	handle := func(f *ingestor.Follower, frames [][]byte) error {
		t.Helper()
		b, err := kvevents.Decode(frames)
		if err != nil {
			t.Fatal(err)
		}
		return f.Handle(ctx, b)
	}
	for range 3 {
		if err := handle(old, fx.block()); err != nil {
			t.Fatal(err)
		}
	}
	if err := fx.st.ClaimReplica(ctx, tModel, tRep, "ing-b"); err != nil {
		t.Fatal(err)
	}
	if err := next.Sync(ctx); err != nil {
		t.Fatalf("the new owner's sync: %v", err)
	}
	missed := fx.block() // the former owner's SUB drops it
	if err := handle(next, missed); err != nil {
		t.Fatal(err)
	}
	after := fx.block()
	if err := handle(next, after); err != nil {
		t.Fatal(err)
	}
	if err := handle(old, after); !errors.Is(err, kvroute.ErrFenced) {
		t.Errorf("the former owner's batch after its gap: err %v, want ErrFenced", err)
	}
	if !old.Fenced() {
		t.Error("the former owner is not fenced")
	}
	fx.wantResets(t, 0)
	fx.wantHeld(t, 0, 5)
	t.Run("a fenced follower asks the store nothing", func(t *testing.T) {
		calls := fx.st.callCount(tModel, tRep)
		if err := handle(old, fx.block()); !errors.Is(err, kvroute.ErrFenced) {
			t.Errorf("err %v, want ErrFenced", err)
		}
		if got := fx.st.callCount(tModel, tRep); got != calls {
			t.Errorf("store calls: got %d, want %d", got, calls)
		}
	})
	t.Run("unfenced, it resumes from what the store holds", func(t *testing.T) {
		if err := fx.st.ClaimReplica(ctx, tModel, tRep, "ing-a"); err != nil {
			t.Fatal(err)
		}
		old.Unfence()
		if err := handle(old, fx.block()); err != nil {
			t.Fatalf("after the claim back: %v", err)
		}
		if err := handle(next, fx.block()); !errors.Is(err, kvroute.ErrFenced) {
			t.Errorf("the other writer after the claim back: err %v, want ErrFenced", err)
		}
	})
}
