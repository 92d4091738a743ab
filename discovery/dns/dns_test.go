package dns_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/dns"
	"github.com/kvroute/kvroute/internal/dnstest"
	"github.com/kvroute/kvroute/internal/wait"
)

func names(eps []discovery.Endpoint) []string {
	var out []string
	for _, e := range eps {
		out = append(out, e.Name)
	}
	return out
}

func TestResolveRealServer(t *testing.T) {
	name := "vllm." + dnstest.Domain
	srv := dnstest.Start(t, map[string][]string{name: {"127.0.0.3", "127.0.0.2"}},
		dnstest.SRV{Name: "_http._tcp.vllm." + dnstest.Domain, Target: "a." + dnstest.Domain, Port: 8001},
		dnstest.SRV{Name: "_http._tcp.vllm." + dnstest.Domain, Target: "b." + dnstest.Domain, Port: 8002})
	ctx := context.Background()

	t.Run("a records", func(t *testing.T) {
		s, err := dns.New(dns.Config{Name: name, Server: srv.Addr, HTTPPort: 8000, EventsPort: 5557})
		if err != nil {
			t.Fatal(err)
		}
		eps, err := s.Resolve(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := names(eps), []string{"127.0.0.2-8000", "127.0.0.3-8000"}; !equal(got, want) {
			t.Fatalf("endpoints: got %v, want %v", got, want)
		}
		if e := eps[0]; e.Host != "127.0.0.2" || e.HTTPPort != 8000 || e.EventsPort != 5557 || e.ReplayPort != 0 {
			t.Errorf("endpoint: got %+v", e)
		}
		if got, want := s.Name(), "dns:"+name; got != want {
			t.Errorf("name: got %q, want %q", got, want)
		}
	})
	t.Run("srv records", func(t *testing.T) {
		srv.SetHosts(t, map[string][]string{name: {"127.0.0.3", "127.0.0.2"}, "a." + dnstest.Domain: {"127.0.0.4"}, "b." + dnstest.Domain: {"127.0.0.5"}})
		s, err := dns.New(dns.Config{Name: "_http._tcp.vllm." + dnstest.Domain, Server: srv.Addr, EventsPort: 5557, ReplayPort: 5558})
		if err != nil {
			t.Fatal(err)
		}
		eps, err := s.Resolve(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := names(eps), []string{"127.0.0.4-8001", "127.0.0.5-8002"}; !equal(got, want) {
			t.Fatalf("endpoints: got %v, want %v", got, want)
		}
	})
	t.Run("nxdomain is empty", func(t *testing.T) {
		s, err := dns.New(dns.Config{Name: "none." + dnstest.Domain, Server: srv.Addr, HTTPPort: 8000})
		if err != nil {
			t.Fatal(err)
		}
		eps, err := s.Resolve(ctx)
		if err != nil || len(eps) != 0 {
			t.Fatalf("got %v, %v; want no endpoints and no error", eps, err)
		}
	})
	t.Run("run reports changes", func(t *testing.T) {
		s, err := dns.New(dns.Config{Name: name, Server: srv.Addr, HTTPPort: 8000, Interval: 10 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		var mu sync.Mutex
		var last []string
		reports := 0
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() {
			done <- s.Run(ctx, func(eps []discovery.Endpoint) { mu.Lock(); last, reports = names(eps), reports+1; mu.Unlock() })
		}()
		got := func() ([]string, int) { mu.Lock(); defer mu.Unlock(); return last, reports }
		wait.Until(t, "the first report", func() bool { l, _ := got(); return len(l) == 2 })
		srv.SetHosts(t, map[string][]string{name: {"127.0.0.2"}})
		wait.Until(t, "a report without 127.0.0.3", func() bool { l, _ := got(); return equal(l, []string{"127.0.0.2-8000"}) })
		srv.SetHosts(t, map[string][]string{})
		wait.Until(t, "an empty report after NXDOMAIN", func() bool { l, n := got(); return len(l) == 0 && n == 3 })
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("run: got %v, want context.Canceled", err)
		}
	})
}

// flaky answers once, then fails every lookup as a timed-out server does.
type flaky struct {
	mu    sync.Mutex
	calls int
}

func (f *flaky) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	if f.calls == 1 {
		return []netip.Addr{netip.MustParseAddr("10.0.0.1")}, nil
	}
	return nil, &net.DNSError{Err: "i/o timeout", IsTimeout: true}
}

func (f *flaky) LookupSRV(context.Context, string, string, string) (string, []*net.SRV, error) {
	return "", nil, errors.New("unused")
}

func (f *flaky) n() int { f.mu.Lock(); defer f.mu.Unlock(); return f.calls }

func TestFailedLookupKeepsLastSet(t *testing.T) {
	r := &flaky{}
	s, err := dns.New(dns.Config{Name: "vllm.example", Resolver: r, HTTPPort: 8000, Interval: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reports := make(chan []discovery.Endpoint, 16)
	go func() { _ = s.Run(ctx, func(eps []discovery.Endpoint) { reports <- eps }) }()
	first := wait.Recv(t, "the first report", reports)
	if got := names(first); !equal(got, []string{"10.0.0.1-8000"}) {
		t.Fatalf("first report: got %v", got)
	}
	wait.Until(t, "five failed lookups", func() bool { return r.n() >= 6 })
	select {
	case eps := <-reports:
		t.Fatalf("a failed lookup reported %v; want the last set kept (no report)", names(eps))
	default:
	}
}

func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		c    dns.Config
	}{
		{"no name", dns.Config{HTTPPort: 8000}},
		{"no http port", dns.Config{Name: "vllm.example"}},
		{"events port out of range", dns.Config{Name: "vllm.example", HTTPPort: 8000, EventsPort: 70000}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := dns.New(tc.c); err == nil {
				t.Errorf("got no error for %+v", tc.c)
			}
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
