package tests_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/store"
	"github.com/redis/go-redis/v9"
)

// TestSentinelFailover runs decisions through a store opened on a real
// Sentinel while the Sentinel fails its primary over to the replica: a
// planned failover (SENTINEL FAILOVER, as a managed Redis does for
// maintenance), and the one after the primary dies (SIGKILL; the
// Sentinel declares it down after 2 s). Every decision is answered
// within the request deadline (degraded while the store cannot be
// asked), every one is released, decisions are cache-aware again by
// themselves with the index the old primary replicated, and bookings
// land on the new primary. Each runs with the lookups' reads on the
// primary and on the replica (--redis-read-replicas): the replica that is
// promoted leaves the read client no replica, and it reads from the new
// primary.
func TestSentinelFailover(t *testing.T) {
	for _, reads := range []string{"primary", "replica"} {
		t.Run("planned/reads="+reads, func(t *testing.T) {
			sentinelFault(t, reads == "replica", func(set redistest.SentinelSet, sc *redis.SentinelClient) error {
				return sc.Failover(context.Background(), set.Master).Err()
			})
		})
		t.Run("primary killed/reads="+reads, func(t *testing.T) {
			sentinelFault(t, reads == "replica", func(set redistest.SentinelSet, _ *redis.SentinelClient) error {
				set.KillPrimary(t)
				return nil
			})
		})
	}
}

func sentinelFault(t *testing.T, onReplica bool, fault func(redistest.SentinelSet, *redis.SentinelClient) error) {
	set := redistest.Sentinels(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	st, err := store.OpenConfig(ctx, store.Config{Addrs: []string{set.Sentinel}, MasterName: set.Master, ReadReplicas: onReplica}, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() }) // after the router's task (faultRouter) stops
	rt := faultRouter(t, st, 8)
	const m = "sentinel-model"
	p := heldPrompt(t, ctx, st, rt, m, rand.New(rand.NewPCG(12, 12)))
	aware := func(d router.Decision) bool { return !d.Degraded && d.Replica.ID == m+"-r0" && d.Matched == 8 }

	sc := redis.NewSentinelClient(&redis.Options{Addr: set.Sentinel})
	defer sc.Close()
	// The replica must hold the index before it is promoted.
	redistest.WaitExists(t, set.Replica, "kvr:{m:"+m+"}:blk", 10*time.Second)
	rc := redis.NewClient(&redis.Options{Addr: set.Replica})
	defer rc.Close()

	var (
		decisions, degraded int
		slowest             time.Duration
		switched, recovered time.Time
	)
	failedOver := make(chan error, 1)
	flowing := make(chan struct{}) // the fault comes under traffic
	go func() {
		<-flowing
		failedOver <- fault(set, sc)
	}()
	for deadline := time.Now().Add(40 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if decisions == 10 {
			close(flowing)
		}
		t0 := time.Now()
		d, err := rt.Route(ctx, router.Request{Model: m, Tokens: p})
		took := time.Since(t0)
		if err != nil {
			t.Fatalf("decision %d failed: %v; want an answer, degraded at worst", decisions, err)
		}
		if _, err := rt.Release(ctx, d.RequestID); err != nil && !errors.Is(err, router.ErrQueued) {
			t.Fatalf("release: %v", err)
		}
		decisions++
		slowest = max(slowest, took)
		if d.Degraded {
			degraded++
		}
		if switched.IsZero() {
			if a, err := sc.GetMasterAddrByName(ctx, set.Master).Result(); err == nil && len(a) == 2 && a[0]+":"+a[1] == set.Replica {
				switched = time.Now()
			}
			continue
		}
		if aware(d) {
			recovered = time.Now()
			break
		}
	}
	if err := <-failedOver; err != nil {
		t.Fatalf("failover: %v", err)
	}
	served, failed := st.ReplicaReads()
	t.Logf("Sentinel failover: %d decisions, %d degraded, slowest %v; cache-aware %v after the Sentinel switched; lookups on a replica %d, failed over %d",
		decisions, degraded, slowest, recovered.Sub(switched).Round(time.Millisecond), served, failed)
	if onReplica && served == 0 {
		t.Error("no lookup read from the replica")
	}
	if switched.IsZero() {
		t.Fatal("the Sentinel never switched to the replica")
	}
	if recovered.IsZero() {
		t.Fatal("no cache-aware decision after the failover")
	}
	if slowest > time.Second {
		t.Errorf("slowest decision took %v, want well inside the 2 s request deadline", slowest)
	}
	// The new primary takes the bookings. Writes that reached the old
	// primary between the promotion and its own demotion are lost when it
	// resyncs as a replica (Redis replicates asynchronously), so the first
	// bookings after the switch may vanish; within a few seconds each one
	// lands on the new primary.
	wait.Until(t, "a booking landed on the new primary", func() bool {
		d, err := rt.Route(ctx, router.Request{Model: m, Tokens: p})
		if err != nil {
			t.Fatalf("route after the failover: %v", err)
		}
		landed, err := rc.HExists(ctx, "kvr:{m:"+m+"}:lb", d.RequestID).Result()
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := rt.Release(ctx, d.RequestID); landed && (err != nil || !ok) {
			t.Errorf("release on the new primary = %v, %v; want true", ok, err)
		}
		return landed
	})
}
