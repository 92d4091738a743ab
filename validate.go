package kvroute

import (
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Bounds on a replica's registry entry. The registry is read on every
// decision and copied into every pod, so one entry must not be able to
// grow it without limit.
const (
	MaxIDBytes       = 128
	MaxModelBytes    = 256
	MaxURLBytes      = 2048
	MaxTopicBytes    = 256
	MaxLabels        = 64
	MaxLabelKeyBytes = 63
	MaxLabelValBytes = 256
)

// validate is Validate's body: the syntax of every field, with no network
// policy (AddressPolicy.Check adds that). The URL is where the proxy posts
// clients' bodies and the ingestor probes /health and /metrics; the event
// endpoints are dialled by the ingestor. Each must be exactly what it
// claims to be, so nothing else (a file, a Redis speaking gopher, a URL
// with credentials in it) can be registered as a replica.
func (r Replica) validate() error {
	switch {
	case r.ID == "":
		return &FieldError{Field: "id", Msg: "is required"}
	case !validID(r.ID):
		return &FieldError{Field: "id", Msg: fmt.Sprintf("may only contain letters, digits and . _ - (at most %d bytes)", MaxIDBytes)}
	case r.Model == "":
		return &FieldError{Field: "model", Msg: "is required"}
	case len(r.Model) > MaxModelBytes:
		return &FieldError{Field: "model", Msg: fmt.Sprintf("is longer than %d bytes", MaxModelBytes)}
	case !printable(r.Model):
		return &FieldError{Field: "model", Msg: "must be printable UTF-8 (no control characters)"}
	case r.URL == "":
		return &FieldError{Field: "url", Msg: "is required"}
	}
	if _, err := ReplicaURL(r.URL); err != nil {
		return &FieldError{Field: "url", Msg: err.Error()}
	}
	for _, ep := range []struct{ field, v string }{{"events", r.Events}, {"replay", r.Replay}} {
		if ep.v == "" {
			continue
		}
		if _, _, err := ZMQEndpoint(ep.v); err != nil {
			return &FieldError{Field: ep.field, Msg: err.Error()}
		}
	}
	switch {
	case len(r.Topic) > MaxTopicBytes:
		return &FieldError{Field: "topic", Msg: fmt.Sprintf("is longer than %d bytes", MaxTopicBytes)}
	case !printable(r.Topic):
		return &FieldError{Field: "topic", Msg: "must be printable UTF-8 (no control characters)"}
	case len(r.Labels) > MaxLabels:
		return &FieldError{Field: "labels", Msg: fmt.Sprintf("has %d entries, more than %d", len(r.Labels), MaxLabels)}
	}
	for k, v := range r.Labels {
		switch {
		case k == "" || len(k) > MaxLabelKeyBytes || !printable(k):
			return &FieldError{Field: "labels", Msg: fmt.Sprintf("key %q must be 1 to %d bytes of printable UTF-8", clip(k), MaxLabelKeyBytes)}
		case len(v) > MaxLabelValBytes || !printable(v):
			return &FieldError{Field: "labels", Msg: fmt.Sprintf("value of %q must be at most %d bytes of printable UTF-8", clip(k), MaxLabelValBytes)}
		}
	}
	switch r.Health {
	case HealthUnknown, HealthHealthy, HealthUnhealthy:
	default:
		return &FieldError{Field: "health", Msg: fmt.Sprintf("must be %q, %q or empty", HealthHealthy, HealthUnhealthy)}
	}
	if r.BlockSize < 0 || r.BlockSize > MaxBlockSize {
		return &FieldError{Field: "block_size", Msg: fmt.Sprintf("must be in 0..%d (0: unknown)", MaxBlockSize)}
	}
	switch r.State {
	case StateServing, StateTerminating, StateGone:
	default:
		return &FieldError{Field: "state", Msg: fmt.Sprintf("must be %q, %q or empty (serving)", StateTerminating, StateGone)}
	}
	switch {
	case len(r.Source) > MaxTopicBytes || !printable(r.Source):
		return &FieldError{Field: "source", Msg: fmt.Sprintf("must be at most %d bytes of printable UTF-8", MaxTopicBytes)}
	case r.DataParallelSize < 0 || r.DataParallelSize > MaxDataParallelSize:
		return &FieldError{Field: "data_parallel_size", Msg: fmt.Sprintf("must be in 0..%d (0 or 1: one engine)", MaxDataParallelSize)}
	}
	for _, f := range []struct{ name, ep string }{{"events", r.Events}, {"replay", r.Replay}} {
		// Engine r's endpoints are the replica's with the port offset by
		// r: the last one must still be a port.
		if _, err := OffsetPort(f.ep, r.Ranks()-1); err != nil {
			return &FieldError{Field: f.name, Msg: "port cannot be offset by every data-parallel rank: " + err.Error()}
		}
	}
	return nil
}

// ReplicaURL parses a replica's base URL: http or https, a host, an
// optional port and path prefix, and nothing else (no credentials, query
// or fragment, which would be sent on every probe and proxied request).
func ReplicaURL(s string) (*url.URL, error) {
	if len(s) > MaxURLBytes {
		return nil, fmt.Errorf("is longer than %d bytes", MaxURLBytes)
	}
	if !printable(s) || strings.ContainsAny(s, " \t") {
		return nil, fmt.Errorf("must be an http or https URL without spaces or control characters")
	}
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("is not a URL")
	}
	switch {
	case u.Scheme != "http" && u.Scheme != "https":
		return nil, fmt.Errorf("must be an http:// or https:// URL, got scheme %q", clip(u.Scheme))
	case u.Opaque != "" || u.Host == "":
		return nil, fmt.Errorf("must name a host (http://host:port)")
	case u.User != nil:
		return nil, fmt.Errorf("must not carry credentials (user:password@)")
	case u.RawQuery != "" || u.ForceQuery:
		return nil, fmt.Errorf("must not have a query")
	case u.Fragment != "" || strings.Contains(s, "#"):
		return nil, fmt.Errorf("must not have a fragment")
	}
	if err := checkHostPort(u.Hostname(), u.Port(), false); err != nil {
		return nil, err
	}
	return u, nil
}

// ZMQEndpoint parses a replica's ZeroMQ endpoint to dial: tcp://host:port.
func ZMQEndpoint(s string) (host, port string, err error) {
	if len(s) > MaxURLBytes || !printable(s) {
		return "", "", fmt.Errorf("must be tcp://host:port")
	}
	rest, ok := strings.CutPrefix(s, "tcp://")
	if !ok {
		return "", "", fmt.Errorf("must be tcp://host:port")
	}
	host, port, err = net.SplitHostPort(rest)
	if err != nil || port == "" {
		return "", "", fmt.Errorf("must be tcp://host:port")
	}
	if err := checkHostPort(host, port, true); err != nil {
		return "", "", err
	}
	return host, port, nil
}

// checkHostPort accepts a DNS name or a canonical IP literal and a port in
// 1..65535 (required when needPort).
func checkHostPort(host, port string, needPort bool) error {
	if host == "" || host == "*" {
		return fmt.Errorf("must name a host")
	}
	if _, err := netip.ParseAddr(host); err != nil {
		if !validHostname(host) {
			return fmt.Errorf("host %q must be a DNS name or a canonical IP address", clip(host))
		}
	}
	if port == "" {
		if needPort {
			return fmt.Errorf("must have a port")
		}
		return nil
	}
	if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
		return fmt.Errorf("port %q must be in 1..65535", clip(port))
	}
	return nil
}

// validHostname is a DNS name: labels of letters, digits, - and _, and a
// last label that does not start with a digit. The last rule refuses the
// numeric spellings of addresses that some resolvers accept
// (2852039166, 0xa9fea9fe, 0251.0376.0251.0376, all 169.254.169.254),
// which would slip past a check on canonical IP literals.
func validHostname(h string) bool {
	h = strings.TrimSuffix(h, ".")
	if h == "" || len(h) > 253 {
		return false
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 {
			return false
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	return !(last[0] >= '0' && last[0] <= '9')
}

// AddressPolicy is the network side of replica validation: which addresses
// a replica's URL and event endpoints may point at. Link-local addresses
// (169.254.0.0/16, fe80::/10), cloud metadata services (169.254.169.254,
// fd00:ec2::254, 100.100.100.200, metadata.google.internal) and
// unspecified or multicast addresses are refused unless an operator
// allows them in Allow: a replica is a vLLM server, and an admin who can
// register one must not be able to point kvroute's probes and proxied
// bodies at the host's credentials. Loopback and private addresses are
// allowed (replicas live there). The zero value is the default policy.
type AddressPolicy struct {
	// Allow lists prefixes that are accepted even though the default
	// refuses them (an on-prem fleet on link-local addresses, say).
	Allow []netip.Prefix
}

// metadataIPs are the cloud instance metadata services.
var metadataIPs = []netip.Addr{
	netip.MustParseAddr("169.254.169.254"), // AWS, GCP, Azure, OpenStack, ...
	netip.MustParseAddr("fd00:ec2::254"),   // AWS over IPv6
	netip.MustParseAddr("100.100.100.200"), // Alibaba Cloud
}

// metadataNames resolve to a metadata service inside their cloud.
var metadataNames = []string{"metadata.google.internal", "metadata.goog", "metadata", "instance-data", "instance-data.ec2.internal"}

// Check applies the policy to a replica whose syntax Validate accepted:
// its URL's and event endpoints' hosts when they are IP literals or known
// metadata names. Names that resolve to a refused address are caught at
// connection time, by package dialer, which every replica connection
// goes through.
func (p AddressPolicy) Check(r Replica) error {
	hosts := []struct{ field, host string }{}
	if u, err := ReplicaURL(r.URL); err == nil {
		hosts = append(hosts, struct{ field, host string }{"url", u.Hostname()})
	}
	for _, ep := range []struct{ field, v string }{{"events", r.Events}, {"replay", r.Replay}} {
		if h, _, err := ZMQEndpoint(ep.v); err == nil {
			hosts = append(hosts, struct{ field, host string }{ep.field, h})
		}
	}
	for _, h := range hosts {
		if err := p.CheckHost(h.host); err != nil {
			return &FieldError{Field: h.field, Msg: err.Error()}
		}
	}
	return nil
}

// CheckHost applies the policy to one host: an IP literal, or a name
// (only the metadata services' names are refused by name).
func (p AddressPolicy) CheckHost(host string) error {
	if a, err := netip.ParseAddr(host); err == nil {
		return p.CheckAddr(a)
	}
	name := strings.ToLower(strings.TrimSuffix(host, "."))
	for _, m := range metadataNames {
		if name == m && !p.allowed(metadataIPs[0]) {
			return fmt.Errorf("host %s is a cloud metadata service; allow %s explicitly to use it", host, metadataIPs[0])
		}
	}
	return nil
}

// CheckAddr applies the policy to one address.
func (p AddressPolicy) CheckAddr(a netip.Addr) error {
	a = a.Unmap().WithZone("")
	if p.allowed(a) {
		return nil
	}
	for _, m := range metadataIPs {
		if a == m {
			return fmt.Errorf("address %s is a cloud metadata service; allow it explicitly to use it", a)
		}
	}
	switch {
	case a.IsLinkLocalUnicast():
		return fmt.Errorf("address %s is link-local; allow its prefix explicitly to use it", a)
	case a.IsLinkLocalMulticast(), a.IsMulticast(), a.IsInterfaceLocalMulticast():
		return fmt.Errorf("address %s is multicast", a)
	case a.IsUnspecified():
		return fmt.Errorf("address %s is unspecified (it means every local address)", a)
	}
	return nil
}

func (p AddressPolicy) allowed(a netip.Addr) bool {
	for _, pre := range p.Allow {
		if pre.Contains(a) {
			return true
		}
	}
	return false
}

// printable reports whether s is valid UTF-8 without control characters.
func printable(s string) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, c := range s {
		if unicode.IsControl(c) || c == utf8.RuneError {
			return false
		}
	}
	return true
}

// clip shortens a value quoted in an error message.
func clip(s string) string {
	if len(s) > 40 {
		s = s[:40] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}
