package ingestor_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/dialer"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/ingestor/kvevents"
	"github.com/kvroute/kvroute/vllmtest"
)

type oneName map[string]netip.Addr

func (r oneName) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return []netip.Addr{a}, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestZMQDialsThroughThePolicy dials a real simulated replica's PUB and
// ROUTER by a name that resolves to the metadata service, with the
// dialer's Connect sending that address to the replica on loopback. Under
// the default policy the SUB and DEALER dials are refused and Connect is
// never called; allowing the prefix, the same dials reach the replica,
// so the refusal is the policy's and not a dead path.
func TestZMQDialsThroughThePolicy(t *testing.T) {
	rep, err := vllmtest.New(vllmtest.Config{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rep.Stop() })
	trap := func(ep string) string { return strings.Replace(ep, "127.0.0.1", "trap.test", 1) }
	for _, tc := range []struct {
		name   string
		policy kvroute.AddressPolicy
		refuse bool
	}{
		{"default policy", kvroute.AddressPolicy{}, true},
		{"prefix allowed", kvroute.AddressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16")}}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var connects atomic.Int64
			d := &dialer.Dialer{Policy: tc.policy, Resolver: oneName{"trap.test": netip.MustParseAddr("169.254.169.254")},
				Connect: func(ctx context.Context, network, address string) (net.Conn, error) {
					connects.Add(1)
					_, port, _ := net.SplitHostPort(address)
					var nd net.Dialer
					return nd.DialContext(ctx, network, net.JoinHostPort("127.0.0.1", port))
				}}
			z := ingestor.ZMQ{Dialer: d}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			s, subErr := z.Subscribe(ctx, trap(rep.EventsEndpoint()), rep.Topic())
			if s != nil {
				s.Close()
			}
			replayErr := z.Replay(ctx, trap(rep.ReplayEndpoint()), 0, 5*time.Second, func(kvevents.Batch) error { return nil })
			for name, err := range map[string]error{"subscribe": subErr, "replay": replayErr} {
				if got := errors.Is(err, dialer.ErrRefused); got != tc.refuse {
					t.Errorf("%s: err %v, refused %v, want %v", name, err, got, tc.refuse)
				}
			}
			if got, want := connects.Load() > 0, !tc.refuse; got != want {
				t.Errorf("connections made: %d, want some: %v", connects.Load(), want)
			}
		})
	}
	t.Run("a ZMQ without a Dialer enforces the default policy", func(t *testing.T) {
		_, err := ingestor.ZMQ{}.Subscribe(context.Background(), "tcp://169.254.169.254:5557", "")
		if !errors.Is(err, dialer.ErrRefused) {
			t.Errorf("err %v, want ErrRefused", err)
		}
	})
}
