// Package dialer is kvroute's outbound connection policy: every connection
// to a replica (the proxy, the ingestor's probes and ZeroMQ dials, remote
// tokenization) is made by a Dialer, which resolves the replica's host
// itself, checks every address against kvroute.AddressPolicy and connects
// only to allowed ones. Registration checks a replica's URL as written;
// only the connection sees where a DNS name points today, so only a check
// at connect time keeps a name resolving to a metadata service from being
// reached.
package dialer

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"syscall"
	"time"

	"github.com/kvroute/kvroute"
)

// ErrRefused is matched (errors.Is) by every error of a dial the policy
// refused, so that callers can tell a forbidden address from a dead one.
var ErrRefused = errors.New("refused by the replica address policy")

// Resolver turns a host name into addresses; *net.Resolver is one.
type Resolver interface {
	// LookupNetIP returns host's addresses for network ("ip", "ip4" or
	// "ip6"), every one of which the policy checks.
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

var _ Resolver = (*net.Resolver)(nil)

// Dialer connects to replicas under an address policy. The zero value
// enforces the default policy; it is safe for concurrent use.
type Dialer struct {
	// Policy says which addresses may be reached; the zero value is the
	// default policy (no link-local, metadata, multicast or unspecified
	// address).
	Policy kvroute.AddressPolicy
	// Resolver resolves host names, so that a test can make a name
	// resolve where it wants. Nil means net.DefaultResolver.
	Resolver Resolver
	// Timeout bounds one connection attempt and KeepAlive is its TCP
	// keep-alive period; zero means 30 s each (http.DefaultTransport's).
	Timeout, KeepAlive time.Duration
	// Logger is told of every refused dial at Warn, so that a replica
	// whose name points somewhere forbidden is visible whichever caller
	// dialled. Nil discards.
	Logger *slog.Logger
	// Connect makes the connection to an address the policy allowed (an
	// IP literal and port). Nil means a net.Dialer with Timeout and
	// KeepAlive and the policy checked again on the socket's address;
	// tests point it at a loopback listener standing in for an address.
	Connect func(ctx context.Context, network, address string) (net.Conn, error)
}

// New is a Dialer enforcing p that logs refusals to log (nil discards).
func New(p kvroute.AddressPolicy, log *slog.Logger) *Dialer {
	return &Dialer{Policy: p, Logger: log}
}

// DialContext connects to address (host:port) on a tcp network. A host
// name is resolved here, every address it resolves to is checked, and
// only allowed ones are tried, in the resolver's order; when none is
// allowed the error matches ErrRefused and nothing was dialled. Errors
// are *net.OpError with Op "dial", as net.Dialer's, so that callers that
// fail over on a failed dial (the proxy) treat a refusal as one.
func (d *Dialer) DialContext(ctx context.Context, network, address string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(address)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: err}
	}
	addrs, err := d.resolve(ctx, network, host)
	if err != nil {
		return nil, &net.OpError{Op: "dial", Net: network, Err: fmt.Errorf("%s: %w", address, err)}
	}
	var errs []error
	for _, a := range addrs {
		if err := d.Policy.CheckAddr(a); err != nil {
			errs = append(errs, d.refuse(address, a, err))
			continue
		}
		c, err := d.connect(ctx, network, a.String(), port)
		if err == nil {
			return c, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	var op *net.OpError
	if len(errs) == 1 && errors.As(errs[0], &op) {
		return nil, errs[0]
	}
	return nil, &net.OpError{Op: "dial", Net: network, Err: errors.Join(errs...)}
}

// resolve is host's addresses: itself when it is an IP literal, else
// what the resolver answers for network's family.
func (d *Dialer) resolve(ctx context.Context, network, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a}, nil
	}
	if err := d.Policy.CheckHost(host); err != nil {
		d.log().Warn("dial refused by the replica address policy", "host", host, "err", err)
		return nil, fmt.Errorf("%w: %w", ErrRefused, err)
	}
	fam := "ip"
	switch network {
	case "tcp4", "udp4":
		fam = "ip4"
	case "tcp6", "udp6":
		fam = "ip6"
	}
	var r Resolver = net.DefaultResolver
	if d.Resolver != nil {
		r = d.Resolver
	}
	addrs, err := r.LookupNetIP(ctx, fam, host)
	if err != nil {
		return nil, fmt.Errorf("resolve: %w", err)
	}
	if len(addrs) == 0 {
		return nil, fmt.Errorf("resolve %s: no address", host)
	}
	return addrs, nil
}

// refuse logs and wraps a refusal of address, resolved to a.
func (d *Dialer) refuse(address string, a netip.Addr, err error) error {
	d.log().Warn("dial refused by the replica address policy", "address", address, "resolved", a.String(), "err", err)
	return fmt.Errorf("%s (%s): %w: %w", address, a, ErrRefused, err)
}

// connect dials one allowed address.
func (d *Dialer) connect(ctx context.Context, network, ip, port string) (net.Conn, error) {
	address := net.JoinHostPort(ip, port)
	if d.Connect != nil {
		return d.Connect(ctx, network, address)
	}
	nd := net.Dialer{Timeout: orDefault(d.Timeout), KeepAlive: orDefault(d.KeepAlive), Control: d.control}
	return nd.DialContext(ctx, network, address)
}

// control checks the address the socket is about to connect to once
// more: whatever a future change to resolve lets through, no socket
// reaches a refused address.
func (d *Dialer) control(_, address string, _ syscall.RawConn) error {
	ap, err := netip.ParseAddrPort(address)
	if err != nil {
		return fmt.Errorf("dial %s: %w", address, err)
	}
	if err := d.Policy.CheckAddr(ap.Addr()); err != nil {
		return d.refuse(address, ap.Addr(), err)
	}
	return nil
}

func (d *Dialer) log() *slog.Logger {
	if d.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return d.Logger
}

func orDefault(v time.Duration) time.Duration {
	if v <= 0 {
		return 30 * time.Second
	}
	return v
}

// Transport is an http.Transport with http.DefaultTransport's settings
// that connects through d. It has no proxy from the environment: a proxy
// would dial the replica on its own, past the policy.
func (d *Dialer) Transport() *http.Transport {
	return &http.Transport{
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConns:          100,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
}
