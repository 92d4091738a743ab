package api_test

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/router"
)

// fakeStore is an in-memory stand-in for the Redis store: it is the
// router's Index and Registry and the API's Registry. It keeps just enough
// semantics (prefix matching, versioned loads, leases) for the API's
// behaviour to be observable.
type fakeStore struct {
	mu       sync.Mutex
	replicas map[string]kvroute.Replica
	approx   map[string]map[kvroute.BlockKey]bool
	loads    map[string]kvroute.Load
	leases   map[string]kvroute.Lease
	advanced map[string]bool
	down     bool
	calls    []string // "advance <id>", "release <id>" in order
}

func newFakeStore() *fakeStore {
	return &fakeStore{
		replicas: map[string]kvroute.Replica{},
		approx:   map[string]map[kvroute.BlockKey]bool{},
		loads:    map[string]kvroute.Load{},
		leases:   map[string]kvroute.Lease{},
		advanced: map[string]bool{},
	}
}

func (f *fakeStore) setDown(down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.down = down
}

func (f *fakeStore) unavailable() error {
	if f.down {
		return fmt.Errorf("fake: %w", kvroute.ErrUnavailable)
	}
	return nil
}

func (f *fakeStore) Lookup(_ context.Context, model string, keys []kvroute.BlockKey, replicas []string) ([]kvroute.Overlap, []kvroute.Load, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.unavailable(); err != nil {
		return nil, nil, err
	}
	ov := make([]kvroute.Overlap, len(replicas))
	ld := make([]kvroute.Load, len(replicas))
	for i, id := range replicas {
		for _, k := range keys {
			if !f.approx[id][k] {
				break
			}
			ov[i].Approx++
		}
		ld[i] = f.loads[id]
	}
	return ov, ld, nil
}

func (f *fakeStore) Reserve(_ context.Context, l kvroute.Lease, ifVersion int64) (bool, kvroute.Load, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.unavailable(); err != nil {
		return false, kvroute.Load{}, err
	}
	cur := f.loads[l.Replica]
	if ifVersion >= 0 && ifVersion != cur.Version {
		return false, cur, nil
	}
	cur.PrefillBlocks += l.PrefillBlocks
	cur.DecodeBlocks += l.DecodeBlocks
	cur.Requests++
	cur.Version++
	f.loads[l.Replica] = cur
	f.leases[l.RequestID] = l
	return true, cur, nil
}

func (f *fakeStore) RecordApprox(_ context.Context, _, replica string, keys []kvroute.BlockKey) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.approx[replica] == nil {
		f.approx[replica] = map[kvroute.BlockKey]bool{}
	}
	for _, k := range keys {
		f.approx[replica][k] = true
	}
	return nil
}

func (f *fakeStore) Advance(_ context.Context, id string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.unavailable(); err != nil {
		return false, err
	}
	f.calls = append(f.calls, "advance "+id)
	l, ok := f.leases[id]
	if ok && !f.advanced[id] {
		f.advanced[id] = true
		cur := f.loads[l.Replica]
		cur.PrefillBlocks -= l.PrefillBlocks
		cur.Version++
		f.loads[l.Replica] = cur
	}
	return ok, nil
}

func (f *fakeStore) Release(_ context.Context, id string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.unavailable(); err != nil {
		return false, err
	}
	f.calls = append(f.calls, "release "+id)
	l, ok := f.leases[id]
	if !ok {
		return false, nil
	}
	cur := f.loads[l.Replica]
	if !f.advanced[id] {
		cur.PrefillBlocks -= l.PrefillBlocks
	}
	cur.DecodeBlocks -= l.DecodeBlocks
	cur.Requests--
	cur.Version++
	f.loads[l.Replica] = cur
	delete(f.leases, id)
	return true, nil
}

func (f *fakeStore) callLog() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

func (f *fakeStore) load(replica string) kvroute.Load {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.loads[replica]
}

func (f *fakeStore) lease(id string) (kvroute.Lease, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	l, ok := f.leases[id]
	return l, ok
}

func (f *fakeStore) PutReplica(_ context.Context, r kvroute.Replica) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.unavailable(); err != nil {
		return err
	}
	f.replicas[r.ID] = r
	return nil
}

func (f *fakeStore) GetReplica(_ context.Context, id string) (kvroute.Replica, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.unavailable(); err != nil {
		return kvroute.Replica{}, err
	}
	r, ok := f.replicas[id]
	if !ok {
		return kvroute.Replica{}, fmt.Errorf("fake: replica %q: %w", id, kvroute.ErrNotFound)
	}
	return r, nil
}

func (f *fakeStore) DeleteReplica(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.unavailable(); err != nil {
		return err
	}
	if _, ok := f.replicas[id]; !ok {
		return fmt.Errorf("fake: replica %q: %w", id, kvroute.ErrNotFound)
	}
	delete(f.replicas, id)
	return nil
}

func (f *fakeStore) ListReplicas(_ context.Context) ([]kvroute.Replica, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.unavailable(); err != nil {
		return nil, err
	}
	var out []kvroute.Replica
	for _, r := range f.replicas {
		out = append(out, r)
	}
	return out, nil
}

func (f *fakeStore) Stats(_ context.Context, _, id string) (kvroute.ReplicaStats, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return kvroute.ReplicaStats{Blocks: len(f.approx[id])}, nil
}

func (f *fakeStore) Loads(_ context.Context, _ string, ids []string) ([]kvroute.Load, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]kvroute.Load, len(ids))
	for i, id := range ids {
		out[i] = f.loads[id]
	}
	return out, nil
}

// harness is one API server over a fake store.
type harness struct {
	store *fakeStore
	srv   *httptest.Server
}

type option func(*api.Config)

func newHarness(tb testing.TB, replicas []kvroute.Replica, opts ...option) *harness {
	tb.Helper()
	fs := newFakeStore()
	for _, r := range replicas {
		fs.replicas[r.ID] = r
	}
	rt, err := router.New(fs, fs, router.DefaultConfig(), router.Options{Rand: mrand.New(mrand.NewPCG(1, 2))})
	if err != nil {
		tb.Fatal(err)
	}
	cfg := api.Config{Router: rt, Registry: fs, Logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&cfg)
	}
	h, err := api.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	return &harness{store: fs, srv: srv}
}

// do sends a request and returns the status, headers and body.
func (h *harness) do(tb testing.TB, method, path, contentType, body string, header ...string) (int, http.Header, string) {
	tb.Helper()
	req, err := http.NewRequest(method, h.srv.URL+path, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp.StatusCode, resp.Header, string(b)
}

func (h *harness) post(tb testing.TB, path, body string, header ...string) (int, http.Header, string) {
	tb.Helper()
	return h.do(tb, http.MethodPost, path, "application/json", body, header...)
}
