// Package tests_test runs kvroute end to end over real processes and
// sockets: a real redis-server, simulated vLLM replicas publishing real
// ZeroMQ events, the ingestor, and the serve wiring (internal/app) over
// real HTTP. Everything listens on loopback and stops with the test.
package tests_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/store"
	"github.com/kvroute/kvroute/vllmtest"
)

const (
	model = "m"
	bs    = 16
	seed  = 7
)

// harness is one kvroute deployment under test.
type harness struct {
	t    testing.TB
	ctx  context.Context
	url  string
	app  *app.App
	base string
	st   *store.Store
	reps map[string]*vllmtest.Replica
	// poll is how often waitFor re-checks; zero (wait.Until's backoff)
	// unless a benchmark, whose measured time includes the poll's
	// granularity, asks for a fixed fine one.
	poll time.Duration
	// redis, when configured, is the store (a Cluster's seeds) in place of
	// url.
	redis store.Config
	// mdl is the replicas' model; empty means the package's model.
	mdl string
}

// model is the model the harness's replicas serve and its decisions ask for.
func (h *harness) model() string {
	if h.mdl != "" {
		return h.mdl
	}
	return model
}

func newHarness(t testing.TB) *harness {
	t.Helper()
	return startHarness(t, &harness{url: redistest.Server(t)})
}

// newClusterHarness is newHarness over a Redis Cluster, its replicas
// serving mdl (whose slot the test picks).
func newClusterHarness(t testing.TB, c *redistest.RedisCluster, mdl string) *harness {
	t.Helper()
	return startHarness(t, &harness{redis: store.Config{Addrs: c.Addrs()}, mdl: mdl})
}

// startHarness starts the serve wiring over h's store.
func startHarness(t testing.TB, h *harness) *harness {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	h.t, h.ctx, h.reps = t, ctx, map[string]*vllmtest.Replica{}
	cfg := router.DefaultConfig()
	cfg.Seed = seed
	cfg.RegistryTTL = 50 * time.Millisecond
	a, err := app.New(ctx, app.Config{Listen: "127.0.0.1:0", RedisURL: h.url, Redis: h.redis, Router: cfg})
	if err != nil {
		t.Fatalf("app: %v", err)
	}
	if err := a.Start(); err != nil {
		t.Fatalf("app start: %v", err)
	}
	t.Cleanup(func() { _ = a.Stop() })
	h.app, h.base = a, "http://"+a.Addr()
	h.st = h.openStore()
	return h
}

func (h *harness) openStore() *store.Store {
	h.t.Helper()
	c := h.redis
	if !c.Configured() {
		c = store.Config{URL: h.url}
	}
	st, err := store.OpenConfig(h.ctx, c, store.Options{})
	if err != nil {
		h.t.Fatalf("store: %v", err)
	}
	h.t.Cleanup(func() { _ = st.Close() })
	return st
}

// addReplica starts a simulated replica and registers it through the API.
func (h *harness) addReplica(id string, cfg vllmtest.Config) *vllmtest.Replica {
	h.t.Helper()
	cfg.Model = h.model()
	if cfg.BlockSize == 0 {
		cfg.BlockSize = bs
	}
	r, err := vllmtest.New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := r.Start(h.ctx); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = r.Stop() })
	body := fmt.Sprintf(`{"model":%q,"url":%q,"events":%q,"replay":%q}`, h.model(), r.URL(), r.EventsEndpoint(), r.ReplayEndpoint())
	if code, resp := h.call("PUT", "/v1/replicas/"+id, body); code != http.StatusOK && code != http.StatusCreated {
		h.t.Fatalf("register %s: %d %s", id, code, resp)
	}
	h.reps[id] = r
	return r
}

// startIngestor runs an ingestor over st until the test ends or stop is
// called.
func (h *harness) startIngestor(owner string, st ingestor.Store, opts ...func(*ingestor.Config)) (ing *ingestor.Ingestor, stop func()) {
	h.t.Helper()
	cfg := ingestor.Config{
		Store: st, Owner: owner, Seed: seed,
		LeaseTTL: 1500 * time.Millisecond, RegistryInterval: 100 * time.Millisecond,
		HealthInterval: 200 * time.Millisecond, MetricsInterval: 200 * time.Millisecond,
		SweepInterval: 500 * time.Millisecond, PurgeGrace: 5 * time.Second,
		StallTimeout: 5 * time.Second, ReplayTimeout: time.Second,
		MinBackoff: 20 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
		Rand: rand.New(rand.NewPCG(1, 2)),
	}
	for _, o := range opts {
		o(&cfg)
	}
	ing, err := ingestor.New(cfg)
	if err != nil {
		h.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(h.ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = ing.Run(ctx) }()
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); <-done }) }
	h.t.Cleanup(stop)
	return ing, stop
}

// waitOwned waits until ing follows every replica and each one's publisher
// sees a subscriber, so no event is lost to ZeroMQ's slow-joiner window.
func (h *harness) waitOwned(ing *ingestor.Ingestor) {
	h.t.Helper()
	h.waitFor("ingestor owns every replica", func() bool { return len(ing.Owned()) == len(h.reps) })
	for id, r := range h.reps {
		ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
		if err := r.WaitSubscribed(ctx); err != nil {
			h.t.Fatalf("%s: no subscriber: %v", id, err)
		}
		cancel()
	}
}

func (h *harness) waitFor(what string, cond func() bool) {
	h.t.Helper()
	if h.poll == 0 {
		wait.Until(h.t, what, cond)
		return
	}
	// A benchmark's fixed fine poll: its measured time includes it.
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out waiting until %s", what)
		}
		time.Sleep(h.poll)
	}
}

// synced waits until the store has applied every batch the replica has
// published so far.
func (h *harness) synced(id string) {
	h.t.Helper()
	r := h.reps[id]
	h.waitFor(id+" applied up to its last batch", func() bool {
		if r.Seq() == 0 {
			return true // it has published nothing (served no request)
		}
		seq, ok, err := h.st.AppliedSeq(h.ctx, h.model(), id)
		return err == nil && ok && seq == r.Seq()-1
	})
}

func (h *harness) call(method, path, body string) (int, string) {
	h.t.Helper()
	req, err := http.NewRequestWithContext(h.ctx, method, h.base+path, bytes.NewBufferString(body))
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

type decision struct {
	RequestID string `json:"request_id"`
	Replica   struct {
		ID string `json:"id"`
	} `json:"replica"`
	Matched int  `json:"matched_blocks"`
	Prompt  int  `json:"prompt_blocks"`
	Approx  bool `json:"approximate"`
}

func (h *harness) route(tokens []int) decision {
	h.t.Helper()
	b, _ := json.Marshal(map[string]any{"model": h.model(), "token_ids": tokens})
	code, body := h.call("POST", "/v1/route", string(b))
	if code != http.StatusOK {
		h.t.Fatalf("route: %d %s", code, body)
	}
	var d decision
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		h.t.Fatalf("route: %v in %s", err, body)
	}
	if code, body := h.call("POST", "/v1/requests/"+d.RequestID+"/release", ""); code != http.StatusOK {
		h.t.Fatalf("release: %d %s", code, body)
	}
	return d
}

func keysOf(tokens []int) []kvroute.BlockKey { return keysFor(model, tokens) }

func keysFor(model string, tokens []int) []kvroute.BlockKey {
	u := make([]uint32, len(tokens))
	for i, t := range tokens {
		u[i] = uint32(t)
	}
	return kvroute.BlockKeys(kvroute.KeySpace{Model: model, Seed: seed}, bs, u, nil)
}

// mismatches compares, for every prompt, what the index says each replica
// holds with what the replica itself would serve from cache. When subset
// is set, the index may know less than the replica (never more).
func (h *harness) mismatches(prompts [][]int, subset bool) []string {
	var ids []string
	for id := range h.reps {
		ids = append(ids, id)
	}
	var bad []string
	for i, p := range prompts {
		ov, _, err := h.st.Lookup(h.ctx, h.model(), keysFor(h.model(), p), ids)
		if err != nil {
			return []string{err.Error()}
		}
		for j, id := range ids {
			truth := h.reps[id].Contains(p, "")
			got := ov[j].GPU
			if got != truth && !(subset && got < truth) {
				bad = append(bad, fmt.Sprintf("prompt %d on %s: index %d blocks, replica holds %d", i, id, got, truth))
			}
		}
	}
	return bad
}

// waitTruth waits until the index agrees with the replicas on prompts.
func (h *harness) waitTruth(prompts [][]int, subset bool) {
	h.t.Helper()
	wait.UntilNil(h.t, "the index to agree with the replicas", func() error {
		if last := h.mismatches(prompts, subset); len(last) > 0 {
			return fmt.Errorf("it disagrees:\n%v", last)
		}
		return nil
	})
}

func prompt(r *rand.Rand, prefix []int, n int) []int {
	out := append([]int(nil), prefix...)
	for range n {
		out = append(out, 3+r.IntN(50_000))
	}
	return out
}

// killable is an ingestor's store that can be made to fail every call, as
// if the ingestor's process died, and that records every applied batch.
type killable struct {
	*store.Store
	dead    atomic.Bool
	applied *appliedLog
}

type appliedLog struct {
	mu sync.Mutex
	n  map[string]int
}

func (l *appliedLog) add(replica string, seq int64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n[fmt.Sprintf("%s/%d", replica, seq)]++
}

func (k *killable) err() error { return fmt.Errorf("killed: %w", kvroute.ErrUnavailable) }

func (k *killable) ApplyRun(ctx context.Context, m, r, w string, first, last int64, ops []kvroute.IndexOp) (kvroute.ApplyResult, error) {
	if k.dead.Load() {
		return kvroute.ApplyResult{}, k.err()
	}
	res, err := k.Store.ApplyRun(ctx, m, r, w, first, last, ops)
	if err == nil && res.Applied {
		for seq := first; seq <= last; seq++ {
			k.applied.add(r, seq)
		}
	}
	return res, err
}

func (k *killable) Acquire(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	if k.dead.Load() {
		return false, k.err()
	}
	return k.Store.Acquire(ctx, name, owner, ttl)
}

func (k *killable) ReleaseOwnership(ctx context.Context, name, owner string) error {
	if k.dead.Load() {
		return k.err()
	}
	return k.Store.ReleaseOwnership(ctx, name, owner)
}

func bytesReader(b []byte) io.Reader { return bytes.NewReader(b) }

// holdChain stores chain (a prompt's block keys from the root) as held by
// replica, in batches of 256 ops starting at seq, the way an ingestor
// would apply a replica's events; engine(j) is block j's engine hash. It
// returns the next unused seq.
func holdChain(tb testing.TB, ctx context.Context, st *store.Store, model, replica string, chain []kvroute.BlockKey, seq int64, engine func(j int) uint64) int64 {
	tb.Helper()
	for start := 0; start < len(chain); start += 256 {
		end := min(start+256, len(chain))
		ops := make([]kvroute.IndexOp, 0, end-start)
		for j := start; j < end; j++ {
			parent := kvroute.NoParent
			if j > 0 {
				parent = chain[j-1]
			}
			ops = append(ops, kvroute.IndexOp{Kind: kvroute.OpStore, EngineHash: engine(j), Key: chain[j], Parent: parent})
		}
		if _, err := st.Apply(ctx, model, replica, seq, ops); err != nil {
			tb.Fatal(err)
		}
		seq++
	}
	return seq
}
