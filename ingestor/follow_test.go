package ingestor_test

import (
	"reflect"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor"
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
	b, err := ingestor.Decode(frames)
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
	return fx.pub.next(stored([]any{1000*fx.pub.epoch + int(s)}, parent, tokens(int(s)*4, 4), 4))
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

// wantHeld checks the replica holds exactly the keys of blocks 0..n-1 of
// the one chained prompt the fixture publishes.
func (fx *followFixture) wantHeld(t *testing.T, from, n int) {
	t.Helper()
	all := kvroute.BlockKeys(kvroute.KeySpace{Model: tModel}, 4, utokens(0, 4*(from+n)), nil)
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
			t.Errorf("held unexpected key %v", k)
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
			b, _ := ingestor.Decode(f)
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
		b, _ := ingestor.Decode(fx.block())
		if err := fx.f.Handle(t.Context(), b); err == nil {
			t.Fatal("Handle: got nil error during outage")
		}
		fx.live(t, fx.block()) // seq 2: resync sees applied 0, replays 1..2
		fx.wantApplied(t, 0, 1, 2)
		fx.wantResets(t, 0)
	})
}
