// Package dns is a discovery source over DNS: the A/AAAA records of a name
// (a Kubernetes headless Service, Consul, Compose's service names) are the
// replicas, at the configured ports, or the SRV records of a name starting
// with "_" give each replica's host and HTTP port. The name is re-resolved
// every interval.
//
// A lookup that fails (a timeout, SERVFAIL, a refused query) keeps the set
// last reported: a resolver's hiccup must not take the fleet out of
// routing. A name that does not exist (NXDOMAIN) or has no records of the
// type asked is an empty set: every replica it had is gone, as a headless
// Service scaled to zero answers.
package dns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/discovery"
)

// Resolver answers the two lookups the source makes; *net.Resolver is one.
type Resolver interface {
	// LookupNetIP returns host's addresses (network "ip": A and AAAA).
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
	// LookupSRV returns name's SRV records (service and proto empty:
	// name is looked up as it is).
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

var _ Resolver = (*net.Resolver)(nil)

// Config configures a DNS source.
type Config struct {
	// Name is looked up: A/AAAA records, or SRV records when it starts
	// with "_" (e.g. _http._tcp.vllm.default.svc.cluster.local). Required.
	Name string
	// Server is the resolver to ask, host:port; empty means the system's.
	// Ignored when Resolver is set.
	Server string
	// Resolver makes the lookups, for tests. Nil means a Go resolver
	// asking Server (or the system's resolver when Server is empty).
	Resolver Resolver
	// Interval is how often the name is re-resolved. Zero means 5s.
	Interval time.Duration
	// Timeout bounds one resolution (with every SRV target's). Zero means
	// the smaller of Interval and 5s.
	Timeout time.Duration
	// HTTPPort is every replica's OpenAI API port with A/AAAA records
	// (SRV records carry their own). Required for A/AAAA names.
	HTTPPort int
	// EventsPort and ReplayPort are every replica's ZeroMQ ports; 0 means
	// none (no events: approximate routing only; no replay buffer).
	EventsPort, ReplayPort int
	// Logger is told of failed lookups. Nil discards.
	Logger *slog.Logger
}

// Source re-resolves one name; it implements discovery.Source.
type Source struct {
	c   Config
	r   Resolver
	log *slog.Logger
}

var _ discovery.Source = (*Source)(nil)

// New checks c and builds the source.
func New(c Config) (*Source, error) {
	srv := strings.HasPrefix(c.Name, "_")
	switch {
	case strings.TrimSuffix(c.Name, ".") == "":
		return nil, errors.New("dns: a name is required")
	case !srv && (c.HTTPPort <= 0 || c.HTTPPort > 65535):
		return nil, fmt.Errorf("dns: %s: HTTP port %d out of range", c.Name, c.HTTPPort)
	case c.EventsPort < 0 || c.EventsPort > 65535 || c.ReplayPort < 0 || c.ReplayPort > 65535:
		return nil, fmt.Errorf("dns: %s: events or replay port out of range", c.Name)
	}
	if c.Interval <= 0 {
		c.Interval = 5 * time.Second
	}
	if c.Timeout <= 0 {
		c.Timeout = min(c.Interval, 5*time.Second)
	}
	r := c.Resolver
	if r == nil {
		r = NewResolver(c.Server)
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Source{c: c, r: r, log: log.With("component", "discovery-dns", "name", c.Name)}, nil
}

// NewResolver is a Go resolver asking server (host:port) for every lookup,
// or the system's resolver when server is empty.
func NewResolver(server string) *net.Resolver {
	if server == "" {
		return net.DefaultResolver
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, server)
	}}
}

// Name is "dns:" and the name looked up.
func (s *Source) Name() string { return "dns:" + s.c.Name }

// Run resolves the name at once and every Interval, and reports the set
// whenever it differs from the last one reported.
func (s *Source) Run(ctx context.Context, update func([]discovery.Endpoint)) error {
	t := time.NewTicker(s.c.Interval)
	defer t.Stop()
	var last []discovery.Endpoint
	reported, failing := false, false
	for {
		lctx, cancel := context.WithTimeout(ctx, s.c.Timeout)
		eps, err := s.Resolve(lctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			if !failing {
				s.log.Warn("dns discovery: lookup failed; keeping the last set", "err", err, "endpoints", len(last))
			}
			failing = true
		default:
			if failing {
				s.log.Info("dns discovery: lookups answer again", "endpoints", len(eps))
			}
			failing = false
			if !reported || !slices.EqualFunc(eps, last, equal) {
				if len(eps) == 0 && len(last) > 0 {
					s.log.Warn("dns discovery: the name has no records now; every replica it had is gone")
				}
				update(eps)
				last, reported = eps, true
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// Resolve looks the name up once: the endpoints sorted by name, empty
// for a name that does not exist or has no records, or an error for a
// lookup that did not answer.
func (s *Source) Resolve(ctx context.Context) ([]discovery.Endpoint, error) {
	var eps []discovery.Endpoint
	if strings.HasPrefix(s.c.Name, "_") {
		_, recs, err := s.r.LookupSRV(ctx, "", "", s.c.Name)
		if notFound(err) {
			return nil, nil
		} else if err != nil {
			return nil, fmt.Errorf("dns: %w", err)
		}
		for _, rec := range recs {
			// The target is resolved here, through the same resolver, so
			// that the replica's addresses are IPs the policy checks and
			// every connection reaches without asking DNS again.
			addrs, err := s.addrs(ctx, strings.TrimSuffix(rec.Target, "."))
			if err != nil {
				return nil, err
			}
			for _, a := range addrs {
				eps = append(eps, s.endpoint(a, int(rec.Port)))
			}
		}
	} else {
		addrs, err := s.addrs(ctx, s.c.Name)
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			eps = append(eps, s.endpoint(a, s.c.HTTPPort))
		}
	}
	slices.SortFunc(eps, func(a, b discovery.Endpoint) int { return strings.Compare(a.Name, b.Name) })
	return slices.CompactFunc(eps, func(a, b discovery.Endpoint) bool { return a.Name == b.Name }), nil
}

func (s *Source) addrs(ctx context.Context, host string) ([]netip.Addr, error) {
	if a, err := netip.ParseAddr(host); err == nil {
		return []netip.Addr{a.Unmap()}, nil
	}
	addrs, err := s.r.LookupNetIP(ctx, "ip", host)
	if notFound(err) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("dns: %w", err)
	}
	for i := range addrs {
		addrs[i] = addrs[i].Unmap()
	}
	return addrs, nil
}

// endpoint is the replica at addr:port. Its name is the address and port,
// stable for as long as the record is: a server that comes back on a new
// address is a new replica.
func (s *Source) endpoint(addr netip.Addr, port int) discovery.Endpoint {
	host := addr.String()
	return discovery.Endpoint{
		Name: strings.ReplaceAll(host, ":", "_") + "-" + strconv.Itoa(port),
		Host: host, HTTPPort: port, EventsPort: s.c.EventsPort, ReplayPort: s.c.ReplayPort,
	}
}

func equal(a, b discovery.Endpoint) bool {
	return a.Name == b.Name && a.Host == b.Host && a.HTTPPort == b.HTTPPort
}

// notFound is a name without records: NXDOMAIN, or an empty answer.
func notFound(err error) bool {
	var de *net.DNSError
	return errors.As(err, &de) && de.IsNotFound
}
