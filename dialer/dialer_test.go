package dialer_test

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/netip"
	"sync/atomic"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/dialer"
)

// names is a resolver answering from a map; a name it lacks fails, so a
// test sees a lookup that should not have happened.
type names map[string][]netip.Addr

func (n names) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := n[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

var metadata = netip.MustParseAddr("169.254.169.254")

// standIn is a loopback HTTP server standing in for every address a
// dialer's Connect is given: a connection it counts is one the policy let
// through.
func standIn(t *testing.T) (connect func(context.Context, string, string) (net.Conn, error), accepted *atomic.Int64) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	accepted = new(atomic.Int64)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}),
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateNew {
				accepted.Add(1)
			}
		}}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	connect = func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, ln.Addr().String())
	}
	return connect, accepted
}

func TestDialer(t *testing.T) {
	res := names{
		"trap.test":  {metadata},
		"mixed.test": {metadata, netip.MustParseAddr("10.0.0.7")},
		"local.test": {netip.MustParseAddr("127.0.0.1")},
	}
	t.Run("a name resolving to the metadata service is refused", func(t *testing.T) {
		connect, accepted := standIn(t)
		d := &dialer.Dialer{Resolver: res, Connect: connect}
		_, err := d.DialContext(context.Background(), "tcp", "trap.test:80")
		checkRefused(t, err)
		if got := accepted.Load(); got != 0 {
			t.Errorf("stand-in accepted %d connections, want 0", got)
		}
	})
	t.Run("the same name under a policy allowing it connects", func(t *testing.T) {
		connect, _ := standIn(t)
		d := &dialer.Dialer{Policy: kvroute.AddressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16")}},
			Resolver: res, Connect: connect}
		c, err := d.DialContext(context.Background(), "tcp", "trap.test:80")
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		c.Close()
	})
	t.Run("refused answers are skipped, allowed ones dialled", func(t *testing.T) {
		var got []string
		d := &dialer.Dialer{Resolver: res, Connect: func(_ context.Context, _, address string) (net.Conn, error) {
			got = append(got, address)
			return nil, errors.New("stop here")
		}}
		_, _ = d.DialContext(context.Background(), "tcp", "mixed.test:8000")
		if len(got) != 1 || got[0] != "10.0.0.7:8000" {
			t.Errorf("dialled %v, want [10.0.0.7:8000]", got)
		}
	})
	t.Run("a metadata name is refused before it is resolved", func(t *testing.T) {
		d := &dialer.Dialer{Resolver: names{}}
		_, err := d.DialContext(context.Background(), "tcp", "metadata.google.internal:80")
		checkRefused(t, err)
	})
	t.Run("a literal is checked without a lookup", func(t *testing.T) {
		d := &dialer.Dialer{Resolver: names{}}
		_, err := d.DialContext(context.Background(), "tcp", "169.254.169.254:80")
		checkRefused(t, err)
	})
	t.Run("the socket's address is checked again", func(t *testing.T) {
		// No Connect: a real net.Dialer, whose Control sees the address.
		d := &dialer.Dialer{Resolver: res}
		_, err := d.DialContext(context.Background(), "tcp", "[fe80::1]:80")
		checkRefused(t, err)
	})
	t.Run("loopback by name connects", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		_, port, _ := net.SplitHostPort(ln.Addr().String())
		d := &dialer.Dialer{Resolver: res}
		c, err := d.DialContext(context.Background(), "tcp", net.JoinHostPort("local.test", port))
		if err != nil {
			t.Fatalf("dial: %v", err)
		}
		c.Close()
	})
	t.Run("the transport refuses too", func(t *testing.T) {
		connect, accepted := standIn(t)
		d := &dialer.Dialer{Resolver: res, Connect: connect}
		_, err := (&http.Client{Transport: d.Transport()}).Get("http://trap.test/latest/meta-data/")
		if !errors.Is(err, dialer.ErrRefused) {
			t.Errorf("GET: err %v, want ErrRefused", err)
		}
		if got := accepted.Load(); got != 0 {
			t.Errorf("stand-in accepted %d connections, want 0", got)
		}
	})
}

// checkRefused fails t unless err is a dial error the policy refused.
func checkRefused(t *testing.T, err error) {
	t.Helper()
	if !errors.Is(err, dialer.ErrRefused) {
		t.Fatalf("err %v, want one matching ErrRefused", err)
	}
	var op *net.OpError
	if !errors.As(err, &op) || op.Op != "dial" {
		t.Errorf("err %v (%T), want a *net.OpError with Op dial", err, err)
	}
}
