package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/internal/telemetry"
	"github.com/kvroute/kvroute/router"
)

// harness is one API server over an in-memory store. The store is kept so
// that tests can take it down and read back what requests booked.
type harness struct {
	store *mock.Memory
	srv   *httptest.Server
	rt    *router.Router
}

// option changes the API's config before the server starts, so that a
// test can exercise one setting without a harness of its own.
type option func(*api.Config)

// newHarness starts an API server whose store has replicas registered and
// stops it when the test ends. The router is seeded, so that decisions
// repeat from run to run.
func newHarness(tb testing.TB, replicas []kvroute.Replica, opts ...option) *harness {
	tb.Helper()
	mem := mock.NewMemory(replicas...)
	return harnessOver(tb, mem, mem.Index(), opts...)
}

// harnessOver is newHarness over mem with the router reading idx (mem's
// Index, some of its functions wrapped by the test).
func harnessOver(tb testing.TB, mem *mock.Memory, idx *mock.Index, opts ...option) *harness {
	tb.Helper()
	// One registry for the router and the admin endpoints, as the store
	// is both in production.
	reg := mem.Registry()
	rt, err := router.New(idx, reg, router.DefaultConfig(), router.Options{Rand: mrand.New(mrand.NewPCG(1, 2))})
	if err != nil {
		tb.Fatal(err)
	}
	cfg := api.Config{Router: rt, Registry: reg, Logger: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		o(&cfg)
	}
	if cfg.MeterProvider == nil {
		withRegistry(tb, prometheus.NewRegistry())(&cfg)
	}
	h, err := api.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	return &harness{store: mem, srv: srv, rt: rt}
}

// withRegistry exports the API's metrics into reg through OpenTelemetry
// and serves reg on /metrics, as internal/app wires them.
func withRegistry(tb testing.TB, reg *prometheus.Registry) option {
	tb.Helper()
	mp, err := telemetry.NewMeterProvider(reg)
	if err != nil {
		tb.Fatal(err)
	}
	return func(c *api.Config) {
		c.MeterProvider = mp
		c.Metrics = promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	}
}

// keys are the block keys the router gives a prompt of model "m".
func (h *harness) keys(tb testing.TB, ids []uint32) []kvroute.BlockKey {
	tb.Helper()
	return kvroute.BlockKeys(h.rt.KeySpace("m", ""), kvroute.DefaultBlockSize, ids, kvroute.RequestExtras(""))
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

// registry is the registry and every replica's load as JSON, to compare
// before and after requests that must change nothing.
func (h *harness) registry(tb testing.TB) string {
	tb.Helper()
	reps, err := h.store.Registry().ListReplicas(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	slices.SortFunc(reps, func(a, b kvroute.Replica) int { return strings.Compare(a.ID, b.ID) })
	var b strings.Builder
	for _, r := range reps {
		j, _ := json.Marshal(r)
		l, _ := json.Marshal(h.store.Load(r.ID))
		fmt.Fprintf(&b, "%s load=%s\n", j, l)
	}
	return b.String()
}
