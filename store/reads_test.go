package store_test

import (
	"context"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/store"
	"github.com/redis/go-redis/v9"
)

// readFixture is a model's index written through s: replica a holds the
// 24-block chain keys, b its first 12 blocks.
func readFixture(t *testing.T, s *store.Store, model string) []kvroute.BlockKey {
	t.Helper()
	ctx := context.Background()
	keys := chain(rand.New(rand.NewPCG(11, uint64(len(model)))), 24)
	for _, id := range []string{"a", "b"} {
		if err := s.PutReplica(ctx, kvroute.Replica{ID: id + "-" + model, Model: model, URL: "http://127.0.0.1:1"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.Apply(ctx, model, "a", 1, storeChain(keys, 0, 24, kvroute.TierGPU)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, model, "b", 1, storeChain(keys, 0, 12, kvroute.TierGPU)); err != nil {
		t.Fatal(err)
	}
	return keys
}

var readWant = []kvroute.Overlap{{GPU: 24, Any: 24}, {GPU: 12, Any: 12}}

// lookups runs n lookups of keys and checks every answer.
func lookups(t *testing.T, s *store.Store, model string, keys []kvroute.BlockKey, n int) {
	t.Helper()
	for i := range n {
		ov, _, err := s.Lookup(context.Background(), model, keys, []string{"a", "b"})
		if err != nil {
			t.Fatalf("lookup %d: %v", i, err)
		}
		for j := range readWant {
			if ov[j] != readWant[j] {
				t.Fatalf("lookup %d: overlap[%d] = %+v, want %+v", i, j, ov[j], readWant[j])
			}
		}
	}
}

// hmgets is how many HMGETs the server at addr has run.
func hmgets(t *testing.T, addr string) int64 {
	t.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rc.Close()
	info, err := rc.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatalf("info %s: %v", addr, err)
	}
	for _, line := range strings.Split(info, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_hmget:calls="); ok {
			n, _ := strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			return n
		}
	}
	return 0
}

// waitReplicated waits until the replica at addr has applied everything
// its primary (primary) had written.
func waitReplicated(t *testing.T, primary, replica string) {
	t.Helper()
	ctx := context.Background()
	pc := redis.NewClient(&redis.Options{Addr: primary, MaxRetries: -1})
	defer pc.Close()
	rc := redis.NewClient(&redis.Options{Addr: replica, MaxRetries: -1})
	defer rc.Close()
	offset := func(c *redis.Client, field string) int64 {
		info, err := c.Info(ctx, "replication").Result()
		if err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(line), field+":"); ok {
				n, _ := strconv.ParseInt(v, 10, 64)
				return n
			}
		}
		return -1
	}
	want := offset(pc, "master_repl_offset")
	for deadline := time.Now().Add(10 * time.Second); offset(rc, "slave_repl_offset") < want; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("replica %s never reached its primary's offset %d", replica, want)
		}
	}
}

// TestReadReplicas runs lookups with their reads on replicas, on every
// topology that has them, against real servers: the answers are the
// primary's, and the replica, not the primary, ran the reads.
func TestReadReplicas(t *testing.T) {
	const n = 40
	check := func(t *testing.T, s *store.Store, model string, keys []kvroute.BlockKey, primary, replica string) {
		t.Helper()
		// The first lookup of a chain runs lookup.lua on the primary (no
		// hints yet); every later one is a plain read of three HMGETs.
		lookups(t, s, model, keys, 1)
		waitReplicated(t, primary, replica)
		p0, r0 := hmgets(t, primary), hmgets(t, replica)
		served0, _ := s.ReplicaReads()
		lookups(t, s, model, keys, n)
		p1, r1 := hmgets(t, primary), hmgets(t, replica)
		served, failed := s.ReplicaReads()
		if served-served0 != n || failed != 0 {
			t.Errorf("replica served %d lookups, %d failed; want %d, none failed", served-served0, failed, n)
		}
		if got := r1 - r0; got != 3*n {
			t.Errorf("the replica ran %d HMGETs, want %d", got, 3*n)
		}
		if got := p1 - p0; got != 0 {
			t.Errorf("the primary ran %d HMGETs, want none", got)
		}
	}
	t.Run("one server", func(t *testing.T) {
		primary := strings.TrimPrefix(redistest.Server(t), "redis://")
		replica := redistest.Replica(t, primary)
		s, err := open(t, store.Config{URL: "redis://" + primary, ReadURL: "redis://" + replica})
		if err != nil {
			t.Fatal(err)
		}
		keys := readFixture(t, s, mdl)
		check(t, s, mdl, keys, primary, replica)
	})
	t.Run("sentinel", func(t *testing.T) {
		set := redistest.Sentinels(t)
		s, err := open(t, store.Config{Addrs: []string{set.Sentinel}, MasterName: set.Master, ReadReplicas: true})
		if err != nil {
			t.Fatal(err)
		}
		keys := readFixture(t, s, mdl)
		check(t, s, mdl, keys, set.Primary, set.Replica)
	})
	t.Run("cluster", func(t *testing.T) {
		c := redistest.ClusterWithReplicas(t, 3, 1)
		s, err := open(t, store.Config{Addrs: c.Addrs()[:3], ReadReplicas: true})
		if err != nil {
			t.Fatal(err)
		}
		keys := readFixture(t, s, mdl)
		p := c.Addrs()[c.Primary(t, "kvr:{m:"+mdl+"}:load")]
		check(t, s, mdl, keys, p, replicaOf(t, c, p))
	})
}

// replicaOf is the address of the cluster node replicating primary.
func replicaOf(t *testing.T, c *redistest.RedisCluster, primary string) string {
	t.Helper()
	for _, a := range c.Addrs() {
		rc := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		info, err := rc.Info(context.Background(), "replication").Result()
		rc.Close()
		if err != nil {
			t.Fatal(err)
		}
		host, port, _ := net.SplitHostPort(primary)
		if strings.Contains(info, "master_host:"+host+"\r\nmaster_port:"+port+"\r\n") {
			return a
		}
	}
	t.Fatalf("no node replicates %s", primary)
	return ""
}

// TestReadReplicaFails: a replica that cannot be reached, or that has
// none of the model's data (restarted empty, not yet synced), costs one
// failed read a window; every lookup still gets the primary's answer.
func TestReadReplicaFails(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replica func(t *testing.T) string
	}{
		{"unreachable", func(t *testing.T) string {
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			addr := l.Addr().String()
			l.Close()
			return addr
		}},
		{"empty", func(t *testing.T) string { return strings.TrimPrefix(redistest.Server(t), "redis://") }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
			primary := redistest.Server(t)
			ctx := context.Background()
			s, err := store.OpenConfig(ctx, store.Config{URL: primary, ReadURL: "redis://" + tc.replica(t)}, store.Options{Now: clk.Now})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			keys := readFixture(t, s, mdl)
			// An unreachable replica fails Open's ping, which opens the
			// first window; an empty one fails the first plain read.
			lookups(t, s, mdl, keys, 20)
			if _, failed := s.ReplicaReads(); failed != 1 {
				t.Errorf("failed replica reads in one window = %d, want 1", failed)
			}
			clk.Add(6 * time.Second) // past the window
			lookups(t, s, mdl, keys, 20)
			if served, failed := s.ReplicaReads(); failed != 2 || served != 0 {
				t.Errorf("after the next window: %d failed replica reads, %d served; want 2, 0", failed, served)
			}
		})
	}
}
