package router_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/router"
)

// TestBackoffScopes: a store failure opens a back-off window only over
// what lives where the failure was. Under Redis Cluster a model's keys
// live on one shard and the registry on another, so a model whose calls
// fail must not degrade the others, and a registry that cannot be read
// must not stop decisions that can still read their model's index.
func TestBackoffScopes(t *testing.T) {
	twoModels := func() []kvroute.Replica {
		var list []kvroute.Replica
		for _, m := range []string{"a", "b"} {
			for i := range 2 {
				list = append(list, kvroute.Replica{ID: fmt.Sprintf("%s%d", m, i), Model: m, URL: fmt.Sprintf("http://127.0.0.1:%d", 9000+i), Events: "tcp://x"})
			}
		}
		return list
	}

	t.Run("a failing model degrades alone", func(t *testing.T) {
		now := time.Unix(1000, 0)
		mem := mock.NewMemory(twoModels()...)
		idx := mem.Index()
		aDown := true
		calls := faultyLookup(idx, func(model string) bool { return model == "a" && aDown })
		r := newRouter(t, idx, mem.Registry(), func() time.Time { return now })
		route := func(model string) router.Decision { t.Helper(); return mustRoute(t, r, model, 1) }
		if d := route("a"); !d.Degraded {
			t.Errorf("a, its store failing: Degraded = false, want true")
		}
		if d := route("b"); d.Degraded {
			t.Errorf("b, its store up: Degraded = true (%s), want a cache-aware decision", d.Reason)
		}
		if r.StoreUp() {
			t.Errorf("StoreUp() = true with a's window open, want false")
		}
		tried := calls["a"]
		now = now.Add(router.DefaultConfig().StoreBackoff / 2)
		if d := route("a"); !d.Degraded {
			t.Errorf("a inside its window: Degraded = false, want true")
		}
		if got := calls["a"] - tried; got != 0 {
			t.Errorf("a's store tried %d times inside its window, want 0", got)
		}
		if d := route("b"); d.Degraded {
			t.Errorf("b while a's window is open: Degraded = true (%s), want false", d.Reason)
		}
		aDown = false
		now = now.Add(router.DefaultConfig().StoreBackoff)
		if d := route("a"); d.Degraded {
			t.Errorf("a after its window: Degraded = true (%s), want false", d.Reason)
		}
		if !r.StoreUp() {
			t.Errorf("StoreUp() = false after every window closed, want true")
		}
	})

	t.Run("registry down, index up", func(t *testing.T) {
		now := time.Unix(1000, 0)
		mem := mock.NewMemory(twoModels()...)
		reg := mem.Registry()
		list, regDown, lists := reg.ListReplicasFn, false, 0
		reg.ListReplicasFn = func(ctx context.Context) ([]kvroute.Replica, error) {
			lists++
			if regDown {
				return nil, fmt.Errorf("store: list replicas: %w", kvroute.ErrUnavailable)
			}
			return list(ctx)
		}
		r := newRouter(t, mem.Index(), reg, func() time.Time { return now })
		route := func(model string) router.Decision { t.Helper(); return mustRoute(t, r, model, 2) }
		if d := route("a"); d.Degraded {
			t.Fatalf("before the fault: Degraded = true (%s)", d.Reason)
		}
		regDown = true
		// The decision that meets the failure does not try the index too:
		// with one Redis it would fail the same way, after a second wait.
		if d := route("a"); !d.Degraded {
			t.Errorf("the decision whose registry read failed: Degraded = false, want true")
		}
		read := lists
		for _, m := range []string{"a", "b", "a"} {
			now = now.Add(100 * time.Millisecond)
			if d := route(m); d.Degraded {
				t.Errorf("%s inside the registry's window: Degraded = true (%s), want a decision over the last copy", m, d.Reason)
			}
		}
		if got := lists - read; got != 0 {
			t.Errorf("registry read %d times inside its window, want 0", got)
		}
		regDown = false
		now = now.Add(router.DefaultConfig().StoreBackoff)
		route("b")
		if lists == read {
			t.Errorf("registry not read again after its window")
		}
	})

	t.Run("one server is one domain", func(t *testing.T) {
		now := time.Unix(1000, 0)
		mem := mock.NewMemory(twoModels()...)
		idx := mem.Index()
		down := false
		calls := faultyLookup(idx, func(string) bool { return down })
		lookups := func() int { return calls["a"] + calls["b"] }
		r, err := router.New(oneServer{idx}, mem.Registry(), router.DefaultConfig(), router.Options{Now: func() time.Time { return now }})
		if err != nil {
			t.Fatal(err)
		}
		mustRoute(t, r, "a", 3)
		down = true
		if d := mustRoute(t, r, "a", 3); !d.Degraded {
			t.Fatalf("a, the server down: Degraded = false, want true")
		}
		tried := lookups()
		if d := mustRoute(t, r, "b", 3); !d.Degraded {
			t.Errorf("b on the same server inside the window: Degraded = false, want true")
		}
		if got := lookups() - tried; got != 0 {
			t.Errorf("the server tried %d times inside its window, want 0: one failure is every model's", got)
		}
	})
}

// oneServer is an index that says all its data is on one server.
type oneServer struct{ *mock.Index }

var (
	_ router.Domains = oneServer{}
	_ router.Domains = byModel{}
)

func (oneServer) FailureDomain(string) string { return "the server" }

func (oneServer) RequestModel(id string) (string, bool) { return "", false }

// byModel is an index whose request ids are "<model>:<n>" and whose
// models each fail apart.
type byModel struct{ *mock.Index }

func (byModel) FailureDomain(model string) string { return model }

func (byModel) RequestModel(id string) (string, bool) {
	m, _, ok := strings.Cut(id, ":")
	return m, ok
}

// TestProgressByDomain: a model whose store calls fail queues its own
// progress reports, and neither makes another model's reports wait: they
// go to the store at once, and a retry pass delivers the reports of a
// domain that answers again past those of one still down.
func TestProgressByDomain(t *testing.T) {
	ctx := context.Background()
	mem := mock.NewMemory(fleet(1, true)...)
	idx := mem.Index()
	var mu sync.Mutex
	downModels := map[string]bool{"a": true}
	delivered := map[string]int{}
	idx.ReleaseFn = func(ctx context.Context, id string) (bool, error) {
		m, _, _ := strings.Cut(id, ":")
		mu.Lock()
		defer mu.Unlock()
		if downModels[m] {
			return false, fmt.Errorf("store: release: %w", kvroute.ErrUnavailable)
		}
		delivered[m]++
		return true, nil
	}
	cfg := router.DefaultConfig()
	cfg.StoreBackoff = 20 * time.Millisecond
	r, err := router.New(byModel{idx}, mem.Registry(), cfg, router.Options{})
	if err != nil {
		t.Fatal(err)
	}
	release := func(id string, want error) {
		t.Helper()
		if _, err := r.Release(ctx, id); !errors.Is(err, want) {
			t.Fatalf("release %s = %v, want %v", id, err, want)
		}
	}
	release("a:1", router.ErrQueued)
	release("b:1", nil) // a's window is no reason to queue b's report
	mu.Lock()
	downModels["b"] = true
	mu.Unlock()
	release("b:2", router.ErrQueued)
	release("a:2", router.ErrQueued)
	mu.Lock()
	downModels["b"] = false // b's shard is back; a's is not
	mu.Unlock()
	runCtx, stop := context.WithCancel(ctx)
	ran := make(chan struct{})
	go func() { defer close(ran); _ = r.Run(runCtx) }()
	defer func() { stop(); <-ran }()
	wait.UntilNil(t, "b's two releases delivered while a's shard stays down", func() error {
		mu.Lock()
		got := delivered["b"]
		mu.Unlock()
		if got != 2 {
			return fmt.Errorf("%d of 2 delivered; queued %d", got, r.Queued())
		}
		return nil
	})
	if q := r.Queued(); q != 2 {
		t.Errorf("queued = %d, want a's 2 still waiting", q)
	}
}

// mustRoute decides for model (a 64-token prompt from seed) and fails the
// test on an error.
func mustRoute(t *testing.T, r *router.Router, model string, seed uint64) router.Decision {
	t.Helper()
	d, err := r.Route(context.Background(), router.Request{Model: model, Tokens: tokens(seed, 64)})
	if err != nil {
		t.Fatalf("route %s: %v", model, err)
	}
	return d
}

// faultyLookup makes idx's lookups fail (unavailable) for the models fail
// names, and returns the lookups made per model.
func faultyLookup(idx *mock.Index, fail func(model string) bool) map[string]int {
	lookup, calls := idx.LookupFn, map[string]int{}
	idx.LookupFn = func(ctx context.Context, model string, keys []kvroute.BlockKey, replicas []string) ([]kvroute.Overlap, []kvroute.Load, error) {
		calls[model]++
		if fail(model) {
			return nil, nil, fmt.Errorf("store: lookup: %w", kvroute.ErrUnavailable)
		}
		return lookup(ctx, model, keys, replicas)
	}
	return calls
}
