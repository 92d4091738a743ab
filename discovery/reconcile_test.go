package discovery_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/store"
)

const source = "dns:vllm.test"

// modelServer is a replica's /v1/models: a base model and an adapter,
// failing while down is set.
type modelServer struct {
	*httptest.Server
	down  atomic.Bool
	model string
}

func newModelServer(t *testing.T, model string) *modelServer {
	t.Helper()
	m := &modelServer{model: model}
	m.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if m.down.Load() || r.URL.Path != "/v1/models" {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintf(w, `{"object":"list","data":[{"id":"sql-lora","root":"/l","parent":%q},{"id":%q,"root":"/models/x","parent":null}]}`, m.model, m.model)
	}))
	t.Cleanup(m.Close)
	return m
}

func (m *modelServer) endpoint(name string) discovery.Endpoint {
	host, port, _ := net.SplitHostPort(m.Listener.Addr().String())
	p, _ := strconv.Atoi(port)
	return discovery.Endpoint{Name: name, Host: host, HTTPPort: p, EventsPort: 5557}
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) now() time.Time      { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *clock) add(d time.Duration) { c.mu.Lock(); c.t = c.t.Add(d); c.mu.Unlock() }

func setup(t *testing.T) (*store.Store, *discovery.Reconciler, *clock) {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, redistest.Server(t), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	clk := &clock{t: time.Unix(1_800_000_000, 0)}
	r, err := discovery.New(discovery.Config{Registry: st, Sources: []discovery.Source{static{}}, Owner: "a",
		Grace: 30 * time.Second, Now: clk.now})
	if err != nil {
		t.Fatal(err)
	}
	return st, r, clk
}

func get(t *testing.T, st *store.Store, id string) (kvroute.Replica, bool) {
	t.Helper()
	r, err := st.GetReplica(context.Background(), id)
	if err != nil {
		if strings.Contains(err.Error(), "not found") {
			return r, false
		}
		t.Fatal(err)
	}
	return r, true
}

func TestReconcileLifecycle(t *testing.T) {
	st, r, clk := setup(t)
	ctx := context.Background()
	m := newModelServer(t, "qwen")
	ep := m.endpoint("127.0.0.1:" + strconv.Itoa(m.endpoint("").HTTPPort))
	id := discovery.ReplicaID(ep.Name)

	t.Run("model unknown: not registered", func(t *testing.T) {
		m.down.Store(true)
		r.Reconcile(ctx, source, []discovery.Endpoint{ep})
		if _, ok := get(t, st, id); ok {
			t.Fatal("registered before its model was known")
		}
		m.down.Store(false)
	})
	t.Run("registered with its model", func(t *testing.T) {
		r.Reconcile(ctx, source, []discovery.Endpoint{ep})
		got, ok := get(t, st, id)
		if !ok {
			t.Fatal("not registered")
		}
		if got.Model != "qwen" || got.Source != source || got.URL != "http://"+m.Listener.Addr().String() ||
			got.Events != "tcp://127.0.0.1:5557" || got.Replay != "" || got.State != kvroute.StateServing {
			t.Errorf("replica: got %+v", got)
		}
		if got.Labels["adapters"] != "sql-lora" {
			t.Errorf("adapters label: got %q, want sql-lora", got.Labels["adapters"])
		}
		v, _ := st.RegistryVersion(ctx)
		r.Reconcile(ctx, source, []discovery.Endpoint{ep})
		if v2, _ := st.RegistryVersion(ctx); v2 != v {
			t.Errorf("an unchanged pass moved the registry version: %d to %d", v, v2)
		}
	})
	t.Run("ingestor fields survive a pass", func(t *testing.T) {
		if err := st.SetHealth(ctx, id, kvroute.HealthHealthy, clk.now()); err != nil {
			t.Fatal(err)
		}
		r.Reconcile(ctx, source, []discovery.Endpoint{ep})
		if got, _ := get(t, st, id); got.Health != kvroute.HealthHealthy {
			t.Errorf("health: got %q, want healthy", got.Health)
		}
	})
	t.Run("terminating", func(t *testing.T) {
		term := ep
		term.Terminating = true
		r.Reconcile(ctx, source, []discovery.Endpoint{term})
		if got, _ := get(t, st, id); got.State != kvroute.StateTerminating || got.Routable() {
			t.Errorf("state: got %q (routable %v), want terminating", got.State, got.Routable())
		}
	})
	t.Run("gone at once, back as a new replica", func(t *testing.T) {
		key := kvroute.BlockKey(42)
		if _, err := st.Apply(ctx, "qwen", id, 1, []kvroute.IndexOp{{Kind: kvroute.OpStore, EngineHash: 7, Key: key, Parent: kvroute.NoParent}}); err != nil {
			t.Fatal(err)
		}
		r.Reconcile(ctx, source, nil)
		got, _ := get(t, st, id)
		if got.State != kvroute.StateGone || !got.StateSince.Equal(clk.now()) {
			t.Fatalf("state: got %q since %v, want gone since %v", got.State, got.StateSince, clk.now())
		}
		clk.add(10 * time.Second)
		r.Reconcile(ctx, source, []discovery.Endpoint{ep})
		got, _ = get(t, st, id)
		if got.State != kvroute.StateServing || got.Health != kvroute.HealthUnknown {
			t.Errorf("returned: got state %q health %q, want serving, unprobed", got.State, got.Health)
		}
		if _, ok, _ := st.AppliedSeq(ctx, "qwen", id); ok {
			t.Error("a returning replica kept its applied seq; want its index reset")
		}
	})
	t.Run("purged after the grace with its bookings", func(t *testing.T) {
		lease := kvroute.Lease{RequestID: store.NewRequestID("qwen"), Model: "qwen", Replica: id, PrefillBlocks: 4, DecodeBlocks: 2,
			Expires: time.Now().Add(time.Hour)}
		if booked, _, err := st.Reserve(ctx, lease, -1); err != nil || !booked {
			t.Fatalf("reserve: %v %v", booked, err)
		}
		r.Reconcile(ctx, source, nil)
		clk.add(29 * time.Second)
		r.Reconcile(ctx, source, nil)
		if _, ok := get(t, st, id); !ok {
			t.Fatal("purged before the grace ended")
		}
		clk.add(time.Second)
		r.Reconcile(ctx, source, nil)
		if _, ok := get(t, st, id); ok {
			t.Fatal("not purged after the grace")
		}
		loads, err := st.Loads(ctx, "qwen", []string{id})
		if err != nil {
			t.Fatal(err)
		}
		if l := loads[0]; l.PrefillBlocks != 0 || l.DecodeBlocks != 0 || l.Requests != 0 {
			t.Errorf("load after purge: got %+v, want zero", l)
		}
	})
}

func TestReconcileLeavesOthersAlone(t *testing.T) {
	st, r, _ := setup(t)
	ctx := context.Background()
	m := newModelServer(t, "qwen")
	ep := m.endpoint("hand")
	hand := kvroute.Replica{ID: "hand", Model: "other", URL: "http://10.0.0.9:8000"}
	other := kvroute.Replica{ID: "k8s-pod", Model: "other", URL: "http://10.0.0.8:8000", Source: "k8s:default/vllm"}
	for _, rep := range []kvroute.Replica{hand, other} {
		if err := st.PutReplica(ctx, rep); err != nil {
			t.Fatal(err)
		}
	}
	r.Reconcile(ctx, source, []discovery.Endpoint{ep})
	r.Reconcile(ctx, source, nil)
	for _, want := range []kvroute.Replica{hand, other} {
		got, ok := get(t, st, want.ID)
		if !ok || got.URL != want.URL || got.Source != want.Source || got.State != kvroute.StateServing {
			t.Errorf("%s: got %+v (present %v), want it untouched", want.ID, got, ok)
		}
	}
}

func TestReplicaID(t *testing.T) {
	for _, tc := range []struct{ name, want string }{
		{"127.0.0.2-8000", "127.0.0.2-8000"},
		{"vllm-0", "vllm-0"},
	} {
		if got := discovery.ReplicaID(tc.name); got != tc.want {
			t.Errorf("ReplicaID(%q): got %q, want %q", tc.name, got, tc.want)
		}
	}
	long := strings.Repeat("x", 300)
	for _, name := range []string{"10.0.0.1:8000", "::1-8000", long, "#v", ""} {
		id := discovery.ReplicaID(name)
		if len(id) > kvroute.MaxIDBytes || (kvroute.Replica{ID: id, Model: "m", URL: "http://h:1"}).Validate() != nil {
			t.Errorf("ReplicaID(%q) = %q: not a valid id", name, id)
		}
		if discovery.ReplicaID(name) != id {
			t.Errorf("ReplicaID(%q) is not stable", name)
		}
	}
	if discovery.ReplicaID("a:b") == discovery.ReplicaID("a_b") {
		t.Error("two names share an id")
	}
}

// static reports one fixed set, for Run.
type static struct{ eps []discovery.Endpoint }

func (static) Name() string { return source }
func (s static) Run(ctx context.Context, update func([]discovery.Endpoint)) error {
	update(s.eps)
	<-ctx.Done()
	return ctx.Err()
}

func TestOneDiscovererPerSource(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, redistest.Server(t), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	m := newModelServer(t, "qwen")
	ep := m.endpoint("one")
	if ok, err := st.Acquire(ctx, "discovery:"+source, "other", time.Hour); err != nil || !ok {
		t.Fatalf("acquire: %v %v", ok, err)
	}
	reg := &countingAcquire{Store: st}
	r, err := discovery.New(discovery.Config{Registry: reg, Sources: []discovery.Source{static{eps: []discovery.Endpoint{ep}}},
		Owner: "a", Interval: 10 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	defer func() { cancel(); <-done }()
	// While "other" holds the lease no pass writes; once it is released
	// the next pass does.
	wait.Until(t, "three passes refused the lease", func() bool { return reg.refused.Load() >= 3 })
	if _, ok := get(t, st, "one"); ok {
		t.Fatal("wrote while another discoverer held the source's lease")
	}
	if err := st.ReleaseOwnership(ctx, "discovery:"+source, "other"); err != nil {
		t.Fatal(err)
	}
	wait.Until(t, "the replica registered once the lease is free", func() bool { _, ok := get(t, st, "one"); return ok })
}

// countingAcquire counts the lease acquisitions refused to the reconciler.
type countingAcquire struct {
	*store.Store
	refused atomic.Int64
}

func (c *countingAcquire) Acquire(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	ok, err := c.Store.Acquire(ctx, name, owner, ttl)
	if err == nil && !ok {
		c.refused.Add(1)
	}
	return ok, err
}
