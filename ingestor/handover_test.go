package ingestor_test

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/store"
	"github.com/kvroute/kvroute/vllmtest"
)

// TestIngestorHandover runs two ingestors on a real redis-server against
// one simulated replica, through the lease gap a store that lost its lease
// keys makes: the second ingestor takes the free lease and claims the
// replica while the first still follows it (its next lease renewal is
// minutes away). The first is fenced at its next batch and gives the
// replica up at once, without marking it unfollowed; the index stays
// equal to the replica's cache. Then a writer that holds no lease claims
// the replica (what a former owner's first write does after a loss of the
// writer record): the lease holder is fenced, claims the replica back and
// resyncs.
func TestIngestorHandover(t *testing.T) {
	ctx := t.Context()
	url, st, rep, r := simOnRedis(t)
	a, regA := startOwner(t, st, "ing-a")
	eventually(t, "ing-a follows r1", func() bool { return slices.Equal(a.Owned(), []string{"r1"}) })
	b, regB := startOwner(t, st, "ing-b")
	bs := rep.BlockSize()
	indexed := func(p []int) func() bool {
		keys := kvroute.BlockKeys(kvroute.KeySpace{Model: "m"}, bs, u32s(p), nil)
		return func() bool {
			ov, _, err := st.Lookup(ctx, "m", keys, []string{"r1"})
			return err == nil && ov[0].GPU == len(keys)
		}
	}
	exact := func() bool {
		s, err := st.Stats(ctx, "m", "r1")
		return err == nil && s.Blocks == rep.CachedBlocks()
	}
	followed := func() bool {
		got, err := st.GetReplica(ctx, "r1")
		return err == nil && !got.FollowedSince.IsZero()
	}
	p1 := ints(0, 4*bs)
	rep.Admit(p1, "")
	eventually(t, "the first prompt indexed, r1 followed", func() bool { return indexed(p1)() && followed() })

	rc := rawClient(t, url)
	t.Run("a lease gap: the new owner claims, the former one gives up", func(t *testing.T) {
		if err := rc.Del(ctx, "kvr:own:ingest:r1").Err(); err != nil {
			t.Fatal(err)
		}
		if err := st.PutReplica(ctx, r); err != nil { // a registry change: ing-b asks for the lease now
			t.Fatal(err)
		}
		eventually(t, "ing-b follows r1", func() bool { return slices.Contains(b.Owned(), "r1") })
		p2 := ints(10_000, 3*bs)
		rep.Admit(p2, "")
		eventually(t, "ing-a fenced off r1", func() bool { return len(a.Owned()) == 0 })
		if got := metric(t, regA, "kvroute_ingest_fenced_total", ""); got != 1 {
			t.Errorf("ing-a fenced: got %v, want 1", got)
		}
		eventually(t, "the second prompt indexed", indexed(p2))
		eventually(t, "the index equal to the replica's cache", exact)
		if !followed() {
			t.Error("r1 marked unfollowed by the ingestor that gave it up")
		}
	})
	t.Run("the lease holder claims the replica back", func(t *testing.T) {
		if err := st.ClaimReplica(ctx, "m", "r1", "ing-x"); err != nil {
			t.Fatal(err)
		}
		p3 := ints(20_000, 2*bs)
		rep.Admit(p3, "")
		eventually(t, "the third prompt indexed by ing-b", indexed(p3))
		if got := b.Owned(); !slices.Equal(got, []string{"r1"}) {
			t.Errorf("ing-b follows %v, want [r1]", got)
		}
		if got := metric(t, regB, "kvroute_ingest_fenced_total", ""); got != 1 {
			t.Errorf("ing-b fenced: got %v, want 1", got)
		}
		eventually(t, "the index equal to the replica's cache", exact)
	})
}

// startOwner runs an ingestor named owner whose leases are renewed only
// every 20 s, so that within the test only a registry change or a fence
// moves a replica, and returns it with its metrics.
func startOwner(t *testing.T, st ingestor.Store, owner string) (*ingestor.Ingestor, *prometheus.Registry) {
	t.Helper()
	in, reg, _ := runIngestor(t, ingestor.Config{
		Store: st, Owner: owner, LeaseTTL: time.Minute, RegistryInterval: 20 * time.Millisecond,
		StallTimeout: 10 * time.Minute, MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond,
		Rand: rand.New(rand.NewPCG(1, 2)),
	})
	return in, reg
}

// rawClient is a plain client of the test's redis-server, for what no
// kvroute call does (losing a key).
func rawClient(t *testing.T, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(opt)
	t.Cleanup(func() { c.Close() })
	return c
}

// simOnRedis starts a real redis-server and one simulated replica, r1 of
// model m, registered with its events and replay sockets; both stop when
// t ends.
func simOnRedis(t *testing.T) (string, *store.Store, *vllmtest.Replica, kvroute.Replica) {
	t.Helper()
	ctx := t.Context()
	url := redistest.Server(t)
	st, err := store.Open(ctx, url, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	rep, err := vllmtest.New(vllmtest.Config{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { rep.Stop() })
	r := kvroute.Replica{ID: "r1", Model: "m", URL: rep.URL(), Events: rep.EventsEndpoint(), Replay: rep.ReplayEndpoint()}
	if err := st.PutReplica(ctx, r); err != nil {
		t.Fatal(err)
	}
	return url, st, rep, r
}
