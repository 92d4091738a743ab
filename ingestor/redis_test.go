package ingestor_test

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/ingestor/kvevents"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/store"
	"github.com/kvroute/kvroute/vllmtest"
)

// TestIngestorRedis runs the ingestor against a real redis-server and the
// simulated replica: what scoring looks up must be what the replica holds,
// through gaps and restarts.
func TestIngestorRedis(t *testing.T) {
	ctx := t.Context()
	st, err := store.Open(ctx, redistest.Server(t), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	rep, err := vllmtest.New(vllmtest.Config{Model: "m", Topic: "kv"})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Start(ctx); err != nil {
		t.Fatal(err)
	}
	defer rep.Stop()
	r := kvroute.Replica{ID: "r1", Model: "m", URL: rep.URL(), Events: rep.EventsEndpoint(), Replay: rep.ReplayEndpoint(), Topic: "kv"}
	if err := st.PutReplica(ctx, r); err != nil {
		t.Fatal(err)
	}
	_, _, stop := startIngestor(t, st, "")
	defer stop()
	if err := rep.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	bs := rep.BlockSize()
	gpu := func(p []int, salt string) int {
		keys := kvroute.BlockKeys(kvroute.KeySpace{Model: "m"}, bs, u32s(p), kvroute.RequestExtras(salt))
		ov, _, err := st.Lookup(ctx, "m", keys, []string{"r1"})
		if err != nil {
			t.Fatalf("Lookup: %v", err)
		}
		return ov[0].GPU
	}
	a := ints(0, 5*bs+3)
	rep.Admit(a, "salt-1")
	eventually(t, "prompt indexed", func() bool { return gpu(a, "salt-1") == 5 })
	if got := gpu(a, ""); got != 0 {
		t.Errorf("unsalted lookup of a salted prompt: got %d blocks, want 0", got)
	}

	rep.DropNext(2)
	b := ints(100, 3*bs)
	c := ints(200, 2*bs)
	rep.Admit(b, "")
	rep.Admit(c, "")
	eventually(t, "gap replayed", func() bool { return gpu(b, "") == 3 && gpu(c, "") == 2 })

	rep.Restart()
	d := ints(300, 2*bs)
	rep.Admit(d, "")
	eventually(t, "restart rebuilt", func() bool { return gpu(d, "") == 2 && gpu(a, "salt-1") == 0 && gpu(b, "") == 0 })
	if seq, ok, err := st.AppliedSeq(ctx, "m", "r1"); err != nil || !ok || seq != rep.Seq()-1 {
		t.Errorf("applied seq: got %d %v %v, want %d", seq, ok, err, rep.Seq()-1)
	}
}

// TestIngestorStoreLost: a quiet replica (no event after the store lost
// its data) is rebuilt from its replay buffer as soon as the ingestor sees
// the store's epoch change, and marked followed again once the registry
// lists it (re-seeded unfollowed, as a pod does), long before its stream's
// silence timer would have redialled it.
func TestIngestorStoreLost(t *testing.T) {
	ctx := t.Context()
	url, st, rep, r := simOnRedis(t)
	in, err := ingestor.New(ingestor.Config{Store: st, Owner: "ing-1", RegistryInterval: 50 * time.Millisecond,
		StallTimeout: 10 * time.Minute, Rand: rand.New(rand.NewPCG(1, 2))})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- in.Run(rctx) }()
	defer stopOnce(t, cancel, done)
	if err := rep.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	p := ints(0, 4*rep.BlockSize())
	gpu := gpuHeld(t, st, rep.BlockSize(), p)
	followed := func() bool {
		got, err := st.GetReplica(ctx, "r1")
		return err == nil && !got.FollowedSince.IsZero()
	}
	rep.Admit(p, "")
	eventually(t, "prompt indexed and r1 followed", func() bool { return gpu() == 4 && followed() })

	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	defer c.Close()
	if err := c.FlushAll(ctx).Err(); err != nil { // the store lost its data
		t.Fatal(err)
	}
	if err := st.PutReplica(ctx, r); err != nil { // re-seeded, unfollowed
		t.Fatal(err)
	}
	eventually(t, "the quiet replica rebuilt and followed again", func() bool { return gpu() == 4 && followed() })
}

// TestIngestorModelLost: under Redis Cluster one shard can lose its data
// alone, the model's index with it, while the global epoch's shard keeps
// its own. A quiet replica sends no batch that would find the loss: the
// model's own epoch (Store.ModelEpoch) changed, and the ingestor rebuilds
// its replicas at the next registry poll, with no event and no registry
// change. Before, nothing noticed until the replica's next batch.
func TestIngestorModelLost(t *testing.T) {
	ctx := t.Context()
	url, st, rep, _ := simOnRedis(t)
	startOwner(t, st, "ing-1")
	if err := rep.WaitSubscribed(ctx); err != nil {
		t.Fatal(err)
	}
	p := ints(0, 4*rep.BlockSize())
	gpu := gpuHeld(t, st, rep.BlockSize(), p)
	rep.Admit(p, "")
	eventually(t, "prompt indexed", func() bool { return gpu() == 4 })
	eventually(t, "the model's epoch written", func() bool {
		n, err := rawClient(t, url).Exists(ctx, "kvr:{m:m}:epoch").Result()
		return err == nil && n == 1
	})

	rc := rawClient(t, url)
	lost, err := rc.Keys(ctx, "kvr:{m:m}:*").Result() // the model's shard, wiped
	if err != nil || len(lost) == 0 {
		t.Fatalf("the model's keys: %v, %v", lost, err)
	}
	if err := rc.Del(ctx, lost...).Err(); err != nil {
		t.Fatal(err)
	}
	if gpu() != 0 {
		t.Fatal("the index survived the model's loss")
	}
	bounded := boundedTB{TB: t, deadline: time.Now().Add(20 * time.Second)}
	wait.Until(bounded, "the quiet replica rebuilt", func() bool { return gpu() == 4 })
}

// boundedTB is a test with a nearer deadline, which bounds wait's waits: a
// rebuild that never comes fails in seconds, not at the test's timeout.
type boundedTB struct {
	testing.TB
	deadline time.Time
}

func (b boundedTB) Deadline() (time.Time, bool) { return b.deadline, true }

// gpuHeld returns a lookup of how many leading blocks of prompt p the
// index says r1 of model m holds on GPU (-1 when the lookup fails).
func gpuHeld(t *testing.T, st *store.Store, blockSize int, p []int) func() int {
	keys := kvroute.BlockKeys(kvroute.KeySpace{Model: "m"}, blockSize, u32s(p), nil)
	return func() int {
		ov, _, err := st.Lookup(t.Context(), "m", keys, []string{"r1"})
		if err != nil {
			return -1
		}
		return ov[0].GPU
	}
}

// TestFollowerStoreBehind: the store loses batches it had acknowledged,
// as a Cluster failover to a replica that had not received them, or an
// AOF that lost its last second, does: the replica's keys go back to what
// they were two batches earlier, with no epoch change and no key missing.
// The follower's next batch does not follow the stored seq; the store
// refuses it, and the follower replays from the stored seq, that batch
// included. Before, the batch was applied on top of the old state: its
// parent unknown, the two lost blocks and the new one stayed unindexed.
func TestFollowerStoreBehind(t *testing.T) {
	ctx := t.Context()
	url := redistest.Server(t)
	st, err := store.Open(ctx, url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	fx := &followFixture{pub: &fakePub{tb: t, topic: "kv"}}
	f := ingestor.NewFollower(ingestor.FollowerConfig{Replica: kvroute.Replica{ID: tRep, Model: tModel}, Store: st,
		Writer: "ing-1", Replay: fx.pub.replay(&fx.replays)})
	live := func() {
		t.Helper()
		b, err := kvevents.Decode(fx.block())
		if err != nil {
			t.Fatal(err)
		}
		if err := f.Handle(ctx, b); err != nil {
			t.Fatalf("Handle seq %d: %v", b.Seq, err)
		}
	}
	for range 3 {
		live()
	}
	rc := rawClient(t, url)
	snap := dumpKeys(t, rc, "kvr:{m:"+tModel+"}:*")
	live()
	live()
	restoreKeys(t, rc, "kvr:{m:"+tModel+"}:*", snap) // the failover: two acknowledged batches gone
	if s, err := st.Stats(ctx, tModel, tRep); err != nil || s.AppliedSeq != 2 {
		t.Fatalf("after the loss: %+v, %v; want applied seq 2", s, err)
	}
	live()
	s, err := st.Stats(ctx, tModel, tRep)
	if err != nil {
		t.Fatal(err)
	}
	if s.AppliedSeq != 5 || s.Blocks != 6 {
		t.Errorf("after the next batch: applied seq %d, %d blocks; want 5 and 6", s.AppliedSeq, s.Blocks)
	}
}

// dumpKeys snapshots every key matching pattern (DUMP).
func dumpKeys(t *testing.T, rc *redis.Client, pattern string) map[string]string {
	t.Helper()
	keys, err := rc.Keys(t.Context(), pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := make(map[string]string, len(keys))
	for _, k := range keys {
		v, err := rc.Dump(t.Context(), k).Result()
		if err != nil {
			t.Fatal(err)
		}
		out[k] = v
	}
	return out
}

// restoreKeys puts the keys matching pattern back as snap had them.
func restoreKeys(t *testing.T, rc *redis.Client, pattern string, snap map[string]string) {
	t.Helper()
	keys, err := rc.Keys(t.Context(), pattern).Result()
	if err != nil {
		t.Fatal(err)
	}
	if len(keys) > 0 {
		if err := rc.Del(t.Context(), keys...).Err(); err != nil {
			t.Fatal(err)
		}
	}
	for k, v := range snap {
		if err := rc.Restore(t.Context(), k, 0, v).Err(); err != nil {
			t.Fatal(err)
		}
	}
}
