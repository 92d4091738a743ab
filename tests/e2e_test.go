package tests_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/vllmtest"
	"github.com/redis/go-redis/v9"
)

// TestEventsRouteToHolder: a replica's own cache events reach the index,
// and a request sharing its prefix is routed there, with the matched
// blocks the replica itself then reports as cached.
func TestEventsRouteToHolder(t *testing.T) {
	h := newHarness(t)
	h.addReplica("r0", vllmtest.Config{EventEncoding: "array"})
	h.addReplica("r1", vllmtest.Config{EventEncoding: "map"})
	h.addReplica("r2", vllmtest.Config{EventEncoding: "array", ReplayWithoutTopic: true})
	ing, _ := h.startIngestor("ing-a", h.openStore())
	h.waitOwned(ing)

	r := rand.New(rand.NewPCG(1, 1))
	p := prompt(r, nil, 10*bs+5)
	if _, err := h.reps["r1"].Admit(p, ""); err != nil {
		t.Fatal(err)
	}
	h.synced("r1")

	t.Run("decision", func(t *testing.T) {
		d := h.route(prompt(r, p, 3*bs))
		if d.Replica.ID != "r1" || d.Matched != 10 || d.Approx {
			t.Errorf("routed to %s with %d matched (approx %v), want r1 with 10 from events", d.Replica.ID, d.Matched, d.Approx)
		}
	})
	t.Run("proxy reports the same cached blocks", func(t *testing.T) {
		ext := prompt(r, p, 2*bs)
		want := h.route(ext)
		cached, replica, _ := h.complete(ext)
		if replica != "r1" {
			t.Errorf("proxied to %q, want r1", replica)
		}
		if got := cached / bs; got != want.Matched {
			t.Errorf("replica served %d cached blocks, router promised %d", got, want.Matched)
		}
	})
}

// TestRecovery: lost batches, restarts and unrecoverable gaps each end with
// an index that agrees with what the replica really holds.
func TestRecovery(t *testing.T) {
	t.Run("dropped batches are replayed", func(t *testing.T) {
		h := newHarness(t)
		rep := h.addReplica("r0", vllmtest.Config{})
		ing, _ := h.startIngestor("ing", h.openStore())
		h.waitOwned(ing)
		r := rand.New(rand.NewPCG(2, 2))
		var prompts [][]int
		admit := func() {
			p := prompt(r, nil, 4*bs)
			prompts = append(prompts, p)
			if _, err := rep.Admit(p, ""); err != nil {
				t.Fatal(err)
			}
		}
		admit()
		h.synced("r0")
		rep.DropNext(3)
		for range 4 {
			admit()
		}
		h.synced("r0")
		h.waitTruth(prompts, false)
	})
	t.Run("restart clears and rebuilds", func(t *testing.T) {
		h := newHarness(t)
		rep := h.addReplica("r0", vllmtest.Config{})
		ing, _ := h.startIngestor("ing", h.openStore())
		h.waitOwned(ing)
		r := rand.New(rand.NewPCG(3, 3))
		old := [][]int{prompt(r, nil, 5*bs), prompt(r, nil, 6*bs)}
		for _, p := range old {
			if _, err := rep.Admit(p, ""); err != nil {
				t.Fatal(err)
			}
		}
		h.synced("r0")
		rep.Restart()
		fresh := prompt(r, nil, 3*bs)
		if _, err := rep.Admit(fresh, ""); err != nil {
			t.Fatal(err)
		}
		h.waitTruth(append(old, fresh), false)
		if d := h.route(old[0]); d.Matched != 0 {
			t.Errorf("after restart the index still promises %d blocks of a forgotten prompt", d.Matched)
		}
	})
	t.Run("gap replay cannot cover", func(t *testing.T) {
		h := newHarness(t)
		rep := h.addReplica("r0", vllmtest.Config{ReplayBuffer: 2})
		ing, _ := h.startIngestor("ing", h.openStore())
		h.waitOwned(ing)
		r := rand.New(rand.NewPCG(4, 4))
		var prompts [][]int
		admit := func() {
			p := prompt(r, nil, 3*bs)
			prompts = append(prompts, p)
			if _, err := rep.Admit(p, ""); err != nil {
				t.Fatal(err)
			}
		}
		admit()
		h.synced("r0")
		rep.DropNext(4)
		for range 5 {
			admit()
		}
		// The replica still caches the prompts of the batches nobody can
		// replay; after the rebuild the index must never claim more than
		// the replica holds, and must know everything still replayable.
		h.synced("r0")
		h.waitTruth(prompts, true)
		// The buffer holds the last two batches: the live one and one before.
		h.waitTruth(prompts[len(prompts)-2:], false)
		if got := h.mismatches(prompts[:1], false); len(got) == 0 {
			t.Errorf("the batch before the unrecoverable gap is still indexed; want it cleared by the rebuild")
		}
	})
}

// TestStaleIndexEndToEnd is the seed's section 4 over real sockets: a
// capacity-bound replica evicting under LRU, whose removal events keep the
// router's belief equal to what the replica serves.
func TestStaleIndexEndToEnd(t *testing.T) {
	h := newHarness(t)
	rep := h.addReplica("r0", vllmtest.Config{CapacityBlocks: 60})
	ing, _ := h.startIngestor("ing", h.openStore())
	h.waitOwned(ing)
	r := rand.New(rand.NewPCG(3, 0))
	sys := prompt(r, nil, 4*bs)
	var reqs [][]int
	for range 40 {
		reqs = append(reqs, prompt(r, sys, 4*bs))
	}
	believed, served, total := 0, 0, 0
	for _, p := range append(reqs, reqs...) {
		d := h.route(p)
		cached, err := rep.Admit(p, "")
		if err != nil {
			t.Fatal(err)
		}
		believed += d.Matched
		served += cached / bs
		total += d.Prompt
		h.synced("r0")
	}
	t.Logf("believed %d/%d blocks cached, replica served %d/%d", believed, total, served, total)
	if served >= total/2 {
		t.Fatalf("replica served %d of %d blocks: the cache is not under eviction pressure, the test proves nothing", served, total)
	}
	if believed != served {
		t.Errorf("phantom blocks = %d (believed %d, served %d), want 0", believed-served, believed, served)
	}
}

// TestIngestorTakeover: one of two ingestors dies; the other takes its
// replicas over within the lease TTL, and no batch is applied twice.
func TestIngestorTakeover(t *testing.T) {
	h := newHarness(t)
	h.addReplica("r0", vllmtest.Config{})
	h.addReplica("r1", vllmtest.Config{EventEncoding: "map"})
	log := &appliedLog{n: map[string]int{}}
	a := &killable{Store: h.openStore(), applied: log}
	ingA, stopA := h.startIngestor("ing-a", a)
	h.waitOwned(ingA)
	b := &killable{Store: h.openStore(), applied: log}
	ingB, _ := h.startIngestor("ing-b", b)

	r := rand.New(rand.NewPCG(5, 5))
	var prompts [][]int
	admit := func(id string) {
		p := prompt(r, nil, 3*bs)
		prompts = append(prompts, p)
		if _, err := h.reps[id].Admit(p, ""); err != nil {
			t.Fatal(err)
		}
	}
	for range 3 {
		admit("r0")
		admit("r1")
	}
	h.synced("r0")
	h.synced("r1")
	if got := len(ingB.Owned()); got != 0 {
		t.Fatalf("second ingestor owns %d replicas while the first is alive, want 0", got)
	}

	a.dead.Store(true) // the process dies: no renewals, no goodbye
	stopA()
	killed := time.Now()
	for range 3 {
		admit("r0")
		admit("r1")
	}
	h.waitFor("the second ingestor owns both replicas", func() bool { return len(ingB.Owned()) == 2 })
	t.Logf("takeover after %v (lease TTL 1.5s)", time.Since(killed).Round(10*time.Millisecond))
	h.synced("r0")
	h.synced("r1")
	h.waitTruth(prompts, false)
	log.mu.Lock()
	defer log.mu.Unlock()
	for k, n := range log.n {
		if n != 1 {
			t.Errorf("batch %s applied %d times, want once", k, n)
		}
	}
	if got, want := len(log.n), 12; got != want {
		t.Errorf("applied %d batches, want %d", got, want)
	}
}

// TestBindMode: kvroute binds one SUB endpoint and the replicas connect to
// it (vLLM's PUB connects when its endpoint has no "*"); the topic tells
// the replicas apart, and replay still works over each replica's ROUTER.
func TestBindMode(t *testing.T) {
	h := newHarness(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	bind := "tcp://" + ln.Addr().String()
	ln.Close()
	ing, _ := h.startIngestor("ing", h.openStore(), func(c *ingestor.Config) { c.Bind = bind })
	h.addReplica("r0", vllmtest.Config{ConnectEvents: bind, Topic: "r0"})
	h.addReplica("r1", vllmtest.Config{ConnectEvents: bind, Topic: "r1", EventEncoding: "map"})
	// The registry names each replica's topic; the ingestor routes the
	// one stream's messages by it.
	for _, id := range []string{"r0", "r1"} {
		r := h.reps[id]
		body := fmt.Sprintf(`{"model":%q,"url":%q,"events":%q,"replay":%q,"topic":%q}`, model, r.URL(), bind, r.ReplayEndpoint(), id)
		if code, resp := h.call("PUT", "/v1/replicas/"+id, body); code != http.StatusOK {
			t.Fatalf("re-register %s: %d %s", id, code, resp)
		}
	}
	h.waitOwned(ing)
	r := rand.New(rand.NewPCG(6, 6))
	var prompts [][]int
	for i := range 6 {
		p := prompt(r, nil, 3*bs)
		prompts = append(prompts, p)
		id := []string{"r0", "r1"}[i%2]
		if i == 2 {
			h.reps[id].DropNext(1) // a gap on one replica of the shared stream
		}
		if _, err := h.reps[id].Admit(p, ""); err != nil {
			t.Fatal(err)
		}
	}
	h.synced("r0")
	h.synced("r1")
	h.waitTruth(prompts, false)
}

// TestUnhealthyExcluded: a replica whose /health fails stops receiving
// traffic as soon as the ingestor's probe records it, and comes back when
// it recovers.
func TestUnhealthyExcluded(t *testing.T) {
	h := newHarness(t)
	h.addReplica("r0", vllmtest.Config{})
	h.addReplica("r1", vllmtest.Config{})
	ing, _ := h.startIngestor("ing", h.openStore())
	h.waitOwned(ing)
	r := rand.New(rand.NewPCG(8, 8))
	p := prompt(r, nil, 8*bs)
	if _, err := h.reps["r1"].Admit(p, ""); err != nil {
		t.Fatal(err)
	}
	h.synced("r1")
	if d := h.route(p); d.Replica.ID != "r1" {
		t.Fatalf("healthy: routed to %s, want r1 (it holds the prefix)", d.Replica.ID)
	}
	h.reps["r1"].SetHealthy(false)
	sick := time.Now()
	h.waitFor("r1 is excluded", func() bool { return h.route(p).Replica.ID == "r0" })
	t.Logf("excluded %v after /health started failing (probe every 200ms, registry cache 50ms)", time.Since(sick).Round(10*time.Millisecond))
	for range 10 {
		if d := h.route(p); d.Replica.ID != "r0" {
			t.Fatalf("routed to unhealthy %s", d.Replica.ID)
		}
	}
	h.reps["r1"].SetHealthy(true)
	h.waitFor("r1 is back, prefix and all", func() bool { d := h.route(p); return d.Replica.ID == "r1" && d.Matched == 8 })
}

// TestRedisDown: the real redis-server goes away mid-run. Decisions carry
// on, round-robin over the replicas last known healthy, marked degraded;
// readiness reports the outage.
func TestRedisDown(t *testing.T) {
	h := newHarness(t)
	h.addReplica("r0", vllmtest.Config{})
	h.addReplica("r1", vllmtest.Config{})
	r := rand.New(rand.NewPCG(9, 9))
	p := prompt(r, nil, 4*bs)
	if d := h.route(p); d.Replica.ID == "" {
		t.Fatal("no decision while Redis is up")
	}
	opt, err := redis.ParseURL(h.url)
	if err != nil {
		t.Fatal(err)
	}
	rc := redis.NewClient(opt)
	_ = rc.Do(h.ctx, "SHUTDOWN", "NOSAVE").Err() // the connection drops: no reply
	rc.Close()

	seen := map[string]int{}
	down := time.Now()
	defer func() {
		t.Logf("4 degraded decisions and a readiness check took %v", time.Since(down).Round(time.Millisecond))
	}()
	for range 4 {
		b, _ := json.Marshal(map[string]any{"model": model, "token_ids": p})
		t0 := time.Now()
		code, body := h.call("POST", "/v1/route", string(b))
		t.Logf("degraded decision in %v", time.Since(t0).Round(time.Millisecond))
		if code != http.StatusOK {
			t.Fatalf("route with Redis down: %d %s, want 200", code, body)
		}
		var d struct {
			Replica  struct{ ID string } `json:"replica"`
			Degraded bool                `json:"degraded"`
		}
		if err := json.Unmarshal([]byte(body), &d); err != nil {
			t.Fatal(err)
		}
		if !d.Degraded {
			t.Errorf("degraded = false with Redis down: %s", body)
		}
		seen[d.Replica.ID]++
	}
	if seen["r0"] != 2 || seen["r1"] != 2 {
		t.Errorf("degraded placement %v, want round-robin over r0 and r1", seen)
	}
	// Ready means "this pod can answer decisions": it can (degraded, over
	// the fleet it knows), so a load balancer must not pull every pod at
	// once. The store's own state is reported apart.
	if code, body := h.call("GET", "/readyz", ""); code != http.StatusOK {
		t.Errorf("readyz with Redis down: %d %s, want 200 (degraded decisions still answer)", code, body)
	}
	if _, m := h.call("GET", "/metrics", ""); !strings.Contains(m, "kvroute_store_up 0") {
		t.Errorf("/metrics does not report the store down (kvroute_store_up 0)")
	}

}

// TestReportedBlockSize: replicas running 32-token blocks while the router
// is configured for 16. The ingestor keys their events with the events' own
// block size; once it has scraped the replicas' cache_config_info, the
// router keys requests the same way and finds the prefix.
func TestReportedBlockSize(t *testing.T) {
	const big = 2 * bs
	h := newHarness(t)
	h.addReplica("r0", vllmtest.Config{BlockSize: big})
	h.addReplica("r1", vllmtest.Config{BlockSize: big})
	ing, _ := h.startIngestor("ing", h.openStore())
	h.waitOwned(ing)
	h.waitFor("block size reported", func() bool {
		for _, id := range []string{"r0", "r1"} {
			if r, err := h.st.GetReplica(h.ctx, id); err != nil || r.BlockSize != big {
				return false
			}
		}
		return true
	})

	r := rand.New(rand.NewPCG(9, 9))
	p := prompt(r, nil, 6*big+3)
	if _, err := h.reps["r1"].Admit(p, ""); err != nil {
		t.Fatal(err)
	}
	h.synced("r1")
	d := h.route(prompt(r, p, big))
	if d.Replica.ID != "r1" || d.Matched != 6 || d.Prompt != 7 {
		t.Errorf("routed to %s with %d of %d blocks matched, want r1 with 6 of 7 (32-token blocks)", d.Replica.ID, d.Matched, d.Prompt)
	}
}
