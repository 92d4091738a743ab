package app_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/dialer"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/router"
)

// TestReplicaNameResolvingToMetadata registers a replica whose host name
// resolves (through the injected resolver) to the metadata service,
// 169.254.169.254, and shows that none of the four callers that dial a
// replica reaches it: the proxy, remote tokenization, the ingestor's
// probes and scrapes, and its ZeroMQ SUB dial. Loopback listeners stand in
// for the metadata address (the dialer's Connect sends an allowed
// 169.254.169.254:port there), so a connection the policy let through
// would be counted; each caller reports the refusal its own way.
func TestReplicaNameResolvingToMetadata(t *testing.T) {
	web, webConns := countingListener(t)
	events, eventConns := countingListener(t)
	logs := &recorder{changed: make(chan struct{}, 1)}
	log := slog.New(logs)
	d := &dialer.Dialer{
		Resolver: resolver{"trap.test": netip.MustParseAddr("169.254.169.254")},
		Connect: func(ctx context.Context, network, address string) (net.Conn, error) {
			_, port, _ := net.SplitHostPort(address)
			var nd net.Dialer
			return nd.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
		},
		Logger: log,
	}
	cfg := app.Config{Listen: "127.0.0.1:0", Router: router.DefaultConfig(), Dialer: d, Logger: log}
	cfg.Tasks = []app.Task{app.Ingest(ingestor.Config{Owner: "t", Seed: cfg.Router.Seed,
		HealthInterval: 50 * time.Millisecond, MetricsInterval: 50 * time.Millisecond})}
	a, err := app.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop() })
	rep := kvroute.Replica{ID: "trap", Model: "trap", URL: fmt.Sprintf("http://trap.test:%d", web),
		Events: fmt.Sprintf("tcp://trap.test:%d", events)}
	if err := rep.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := cfg.ReplicaPolicy.Check(rep); err != nil {
		t.Fatalf("policy refused the name at registration, so the test would prove nothing: %v", err)
	}
	if err := a.Store.PutReplica(context.Background(), rep); err != nil {
		t.Fatal(err)
	}
	// The proxy and tokenization are asked before the ingestor runs: once
	// its probe marks the replica unhealthy nothing would route to it.
	srv := httptest.NewServer(a.API)
	defer srv.Close()
	t.Run("proxy", func(t *testing.T) {
		status, raw := call(t, http.MethodPost, srv.URL+"/v1/completions", `{"model":"trap","prompt":[1,2,3],"max_tokens":1}`)
		if status != http.StatusBadGateway {
			t.Errorf("status %d, want %d: %s", status, http.StatusBadGateway, raw)
		}
		logs.wait(t, "dial refused by the replica address policy", "trap.test")
	})
	t.Run("remote tokenization", func(t *testing.T) {
		if status, raw := call(t, http.MethodPost, srv.URL+"/v1/route", `{"model":"trap","prompt":"hello"}`); status != http.StatusOK {
			t.Errorf("route: status %d: %s", status, raw)
		}
		logs.wait(t, "remote tokenization failed; routing cache-blind", dialer.ErrRefused.Error())
	})
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, msg string }{
		{"health probe", "health probe"},
		{"metrics scrape", "scrape"},
		{"zeromq sub dial", "dial events"},
	} {
		t.Run(tc.name, func(t *testing.T) { logs.wait(t, tc.msg, dialer.ErrRefused.Error()) })
	}
	if got := webConns.Load(); got != 0 {
		t.Errorf("the HTTP stand-in accepted %d connections, want 0", got)
	}
	if got := eventConns.Load(); got != 0 {
		t.Errorf("the ZeroMQ stand-in accepted %d connections, want 0", got)
	}
}

// resolver answers each name with one address.
type resolver map[string]netip.Addr

func (r resolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// countingListener is a loopback port that counts and closes every
// connection it accepts.
func countingListener(t *testing.T) (int, *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	n := new(atomic.Int64)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			n.Add(1)
			c.Close()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, n
}

// recorder is a slog handler keeping every record's message and
// attributes, at every level, for tests to wait on.
type recorder struct {
	mu      sync.Mutex
	lines   []string
	changed chan struct{}
}

func (r *recorder) Enabled(context.Context, slog.Level) bool { return true }
func (r *recorder) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *recorder) WithGroup(string) slog.Handler            { return r }

func (r *recorder) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	r.mu.Lock()
	r.lines = append(r.lines, b.String())
	r.mu.Unlock()
	select {
	case r.changed <- struct{}{}:
	default:
	}
	return nil
}

// wait returns once a record with message msg whose text holds sub was
// logged, and fails t when none is within 30 s (a bound on a failure,
// not a pause: the wait ends on the record).
func (r *recorder) wait(t *testing.T, msg, sub string) {
	t.Helper()
	bound := time.After(30 * time.Second)
	for {
		r.mu.Lock()
		for _, l := range r.lines {
			if strings.HasPrefix(l, msg+" ") && strings.Contains(l, sub) {
				r.mu.Unlock()
				return
			}
		}
		r.mu.Unlock()
		select {
		case <-r.changed:
		case <-bound:
			t.Fatalf("no log %q holding %q", msg, sub)
		}
	}
}
