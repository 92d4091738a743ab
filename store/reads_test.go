package store_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
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
	wait.Until(t, fmt.Sprintf("replica %s to reach its primary's offset %d", replica, want), func() bool { return offset(rc, "slave_repl_offset") >= want })
}

// TestReadReplicas runs lookups with their reads on replicas, on every
// topology that has them, against real servers: the answers are the
// primary's, and the replica, not the primary, ran the reads.
func TestReadReplicas(t *testing.T) {
	const n = 40
	// check wants every plain lookup read from one of replicas, all three
	// of its HMGETs from the same one (a lookup's reads must come from
	// one replication offset), and none from the primary.
	check := func(t *testing.T, s *store.Store, model string, keys []kvroute.BlockKey, primary string, replicas ...string) {
		t.Helper()
		// The first lookup of a chain runs lookup.lua on the primary (no
		// hints yet); every later one is a plain read of three HMGETs.
		lookups(t, s, model, keys, 1)
		r0 := make([]int64, len(replicas))
		for i, r := range replicas {
			waitReplicated(t, primary, r)
			r0[i] = hmgets(t, r)
		}
		p0 := hmgets(t, primary)
		served0, _ := s.ReplicaReads()
		lookups(t, s, model, keys, n)
		served, failed := s.ReplicaReads()
		if served-served0 != n || failed != 0 {
			t.Errorf("replica served %d lookups, %d failed; want %d, none failed", served-served0, failed, n)
		}
		var ran []int64
		for i, r := range replicas {
			ran = append(ran, hmgets(t, r)-r0[i])
		}
		if !slices.Contains(ran, 3*n) || slices.Max(ran) != 3*n || sum(ran) != 3*n {
			t.Errorf("the replicas ran %v HMGETs, want %d on one of them and none on the others", ran, 3*n)
		}
		if got := hmgets(t, primary) - p0; got != 0 {
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
		c := redistest.ClusterWithReplicas(t, 3, 2)
		s, err := open(t, store.Config{Addrs: c.Addrs()[:3], ReadReplicas: true})
		if err != nil {
			t.Fatal(err)
		}
		keys := readFixture(t, s, mdl)
		p := c.Addrs()[c.Primary(t, "kvr:{m:"+mdl+"}:load")]
		var reps []string
		for _, i := range c.ReplicasOf(t, p) {
			reps = append(reps, c.Addrs()[i])
		}
		check(t, s, mdl, keys, p, reps...)
	})
}

func sum(v []int64) (n int64) {
	for _, x := range v {
		n += x
	}
	return n
}

// TestReadReplicaFails: a replica that cannot be reached, that accepts
// connections and never answers, or that has none of the model's data
// (restarted empty, not yet synced), costs one failed read a window;
// every lookup still gets the primary's answer within a decision's time.
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
		{"hung", func(t *testing.T) string { return hungServer(t) }},
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
			// A pod's first lookup of a model goes to the primary, short
			// chain or not: an empty replica would answer "nothing held"
			// with nothing to tell it from a model without data.
			ov, _, err := s.Lookup(ctx, mdl, keys[:12], []string{"a", "b"})
			if err != nil || ov[0] != (kvroute.Overlap{GPU: 12, Any: 12}) || ov[1] != (kvroute.Overlap{GPU: 12, Any: 12}) {
				t.Fatalf("first lookup of a 12-block chain = %+v, %v; want 12 blocks on both", ov, err)
			}
			// An unreachable or hung replica fails Open's ping, which
			// opens the first window; an empty one fails the first plain
			// read. Each lookup gets the primary's answer, in time: a
			// decision gives its store calls 250 ms.
			t0 := time.Now()
			lookups(t, s, mdl, keys, 20)
			if took := time.Since(t0); took > 2*time.Second {
				t.Errorf("20 lookups took %v", took)
			}
			if _, failed := s.ReplicaReads(); failed != 1 {
				t.Errorf("failed replica reads in one window = %d, want 1", failed)
			}
			clk.Add(6 * time.Second) // past the window
			lctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
			if _, _, err := s.Lookup(lctx, mdl, keys, []string{"a", "b"}); err != nil {
				t.Errorf("the first lookup after the window, with a decision's 250 ms: %v", err)
			}
			cancel()
			lookups(t, s, mdl, keys, 19)
			if served, failed := s.ReplicaReads(); failed != 2 || served != 0 {
				t.Errorf("after the next window: %d failed replica reads, %d served; want 2, 0", failed, served)
			}
		})
	}
}

// hungServer listens on loopback, accepts connections and never answers
// (a stopped or wedged server); it closes them when the test ends.
func hungServer(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	}()
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return l.Addr().String()
}

// TestReadURL: the read client of one server takes the primary URL's
// credentials, options and database where the read URL gives none, and a
// TLS primary's password never goes to a plain-TCP replica.
func TestReadURL(t *testing.T) {
	for _, tc := range []struct {
		name, primary, read string
		wantAddr, wantPass  string
		wantDB              int
		wantRead            time.Duration
		wantErr             string
	}{
		{name: "inherits", primary: "redis://:pw@p:1/2?read_timeout=2s", read: "redis://r:2", wantAddr: "r:2", wantPass: "pw", wantDB: 2, wantRead: 2 * time.Second},
		{name: "slash path", primary: "redis://:pw@p:1/3", read: "redis://r:2/", wantAddr: "r:2", wantPass: "pw", wantDB: 3, wantRead: 500 * time.Millisecond},
		{name: "own options win", primary: "redis://:pw@p:1/2?read_timeout=2s&pool_size=7", read: "redis://:other@r:2/1?read_timeout=1s", wantAddr: "r:2", wantPass: "other", wantDB: 1, wantRead: time.Second},
		{name: "own database over the primary's query", primary: "redis://p:1?db=2", read: "redis://r:2/1", wantAddr: "r:2", wantDB: 1, wantRead: 500 * time.Millisecond},
		{name: "tls primary, plain replica", primary: "rediss://:pw@p:1", read: "redis://r:2", wantErr: "rediss://"},
		{name: "not a url", primary: "redis://p:1", read: "r:2", wantErr: "read url"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := store.NewReadClient(store.Config{URL: tc.primary, ReadURL: tc.read})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			o := c.(*redis.Client).Options()
			if o.Addr != tc.wantAddr || o.Password != tc.wantPass || o.DB != tc.wantDB || o.ReadTimeout != tc.wantRead {
				t.Errorf("read client: addr %q, password %q, db %d, read timeout %v; want %q, %q, %d, %v",
					o.Addr, o.Password, o.DB, o.ReadTimeout, tc.wantAddr, tc.wantPass, tc.wantDB, tc.wantRead)
			}
		})
	}
}
