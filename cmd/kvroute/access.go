package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/router"
)

// accessFlags are serve's flags for who may call what, which addresses a
// replica may have, and what one request may cost.
type accessFlags struct {
	adminToken, adminTokenFile string
	apiTokens                  stringList
	apiTokenFile               string
	tenantHeader               string
	metricsAuth, insecureAdmin bool
	allowCIDRs                 prefixList
	maxOutputTokens            int
	proxyRetries               int
	proxyHeaderTimeout         time.Duration
	proxyResponseFactor        float64

	// Filled by resolve.
	access api.Access
	policy kvroute.AddressPolicy
}

func addAccessFlags(fs *flag.FlagSet, rc *router.Config) *accessFlags {
	a := &accessFlags{}
	fs.StringVar(&a.adminToken, "admin-token", "", "bearer `token` the admin API requires (the registry, GET /v1/replicas included); prefer the environment or --admin-token-file, a flag shows in ps")
	fs.StringVar(&a.adminTokenFile, "admin-token-file", "", "`file` of admin tokens, one a line (# comments; several for rotation)")
	fs.Var(&a.apiTokens, "api-tokens", "comma-separated bearer `tokens` the decision API and the OpenAI proxy require (default: open); an admin token opens them too")
	fs.StringVar(&a.apiTokenFile, "api-token-file", "", "`file` of API tokens, one a line: NAME:TOKEN names the tenant its requests are charged to in the admission queue (NAME: [A-Za-z0-9._-], at most 64), a bare TOKEN the anonymous tenant")
	fs.StringVar(&a.tenantHeader, "tenant-header", "", "request `header` whose value is the tenant, winning over the token's name; only for a gateway that sets it itself (default: none trusted)")
	fs.BoolVar(&a.metricsAuth, "metrics-auth", false, "put /metrics behind the admin token (default: open, for Prometheus)")
	fs.BoolVar(&a.insecureAdmin, "insecure-admin", false, "serve the admin API without a token on a non-loopback address (anyone who reaches the port can redirect traffic)")
	fs.Var(&a.allowCIDRs, "allow-replica-cidrs", "comma-separated `prefixes` a replica's address may be in although refused by default (link-local, metadata services)")
	fs.IntVar(&a.maxOutputTokens, "max-output-tokens", api.DefaultMaxOutputTokens, "largest max_tokens (and max_completion_tokens) a request may give; it sizes the booking")
	fs.IntVar(&a.proxyRetries, "proxy-retries", api.DefaultProxyRetries, "other replicas a proxied request tries when its replica fails before answering (0: none)")
	fs.DurationVar(&a.proxyHeaderTimeout, "proxy-header-timeout", api.DefaultProxyHeaderTimeout, "longest a proxied stream waits for its replica's response headers before failing over and marking it suspect; a non-streaming request with max_tokens waits this plus --proxy-response-factor times its predicted duration (0: no bound)")
	fs.Float64Var(&a.proxyResponseFactor, "proxy-response-factor", api.DefaultProxyResponseFactor, "multiple of a non-streaming request's predicted duration (prompt at --prefill-tps, max_tokens at the router's decode speed) its replica has to answer, on top of --proxy-header-timeout")
	fs.DurationVar(&rc.MaxLease, "max-lease", router.MaxLease, "longest life of a load booking, whatever a request's length predicts")
	return a
}

// resolve reads the token files and checks the values.
func (a *accessFlags) resolve(rc router.Config) error {
	var admin, client []string
	var named []api.NamedToken
	if a.adminToken != "" {
		admin = append(admin, a.adminToken)
	}
	if a.adminTokenFile != "" {
		toks, err := readTokens(a.adminTokenFile)
		if err != nil {
			return fmt.Errorf("--admin-token-file: %w", err)
		}
		admin = append(admin, toks...)
	}
	client = append(client, a.apiTokens...)
	if a.apiTokenFile != "" {
		toks, err := readTokens(a.apiTokenFile)
		if err != nil {
			return fmt.Errorf("--api-token-file: %w", err)
		}
		for _, t := range toks {
			if nt, ok := namedToken(t); ok {
				named = append(named, nt)
			} else {
				client = append(client, t)
			}
		}
	}
	all := append(append([]string(nil), admin...), client...)
	for _, nt := range named {
		all = append(all, nt.Token)
	}
	for i, t := range all {
		if len(t) < api.MinTokenBytes {
			// Never quote a token.
			return fmt.Errorf("token %d is shorter than %d bytes", i, api.MinTokenBytes)
		}
	}
	if a.metricsAuth && len(admin) == 0 {
		return errors.New("--metrics-auth needs an admin token")
	}
	switch {
	case a.maxOutputTokens <= 0:
		return fmt.Errorf("--max-output-tokens must be positive, got %d", a.maxOutputTokens)
	case a.proxyRetries < 0:
		return fmt.Errorf("--proxy-retries must be >= 0, got %d", a.proxyRetries)
	case a.proxyHeaderTimeout < 0:
		return fmt.Errorf("--proxy-header-timeout must be >= 0, got %v", a.proxyHeaderTimeout)
	case !(a.proxyResponseFactor >= 1):
		return fmt.Errorf("--proxy-response-factor must be at least 1, got %v", a.proxyResponseFactor)
	case rc.MaxLease <= 0:
		return fmt.Errorf("--max-lease must be positive, got %v", rc.MaxLease)
	case rc.MaxLease < time.Second:
		return fmt.Errorf("--max-lease %v is shorter than a request", rc.MaxLease)
	}
	if a.tenantHeader != "" && strings.ContainsAny(a.tenantHeader, " \t:") {
		return fmt.Errorf("--tenant-header %q is not a header name", a.tenantHeader)
	}
	a.access = api.Access{AdminTokens: admin, APITokens: client, NamedAPITokens: named, MetricsAuth: a.metricsAuth, TenantHeader: a.tenantHeader}
	a.policy = kvroute.AddressPolicy{Allow: a.allowCIDRs}
	return nil
}

// checkExposure refuses to serve an open admin API beyond loopback: with
// no admin token, whoever reaches the port can delete replicas or point
// their traffic anywhere.
func (a *accessFlags) checkExposure(listen string) error {
	if len(a.access.AdminTokens) > 0 || a.insecureAdmin || loopbackOnly(listen) {
		return nil
	}
	return fmt.Errorf("refusing to serve the admin API on %q without a token: set KVROUTE_ADMIN_TOKEN or --admin-token-file, listen on loopback (--listen 127.0.0.1:8080), or pass --insecure-admin", listen)
}

// apply hands the settings to the app.
func (a *accessFlags) apply(cfg *app.Config) error {
	cfg.Access, cfg.ReplicaPolicy, cfg.MaxOutputTokens = a.access, a.policy, a.maxOutputTokens
	cfg.ProxyRetries = a.proxyRetries
	if cfg.ProxyRetries == 0 {
		cfg.ProxyRetries = -1 // api: zero is the default, negative none
	}
	cfg.ProxyHeaderTimeout, cfg.ProxyResponseFactor = a.proxyHeaderTimeout, a.proxyResponseFactor
	if cfg.ProxyHeaderTimeout == 0 {
		cfg.ProxyHeaderTimeout = -1 // api: zero is the default, negative none
	}
	return nil
}

// loopbackOnly reports whether listen accepts connections from this host
// only: a loopback address or localhost. An empty host is every interface.
func loopbackOnly(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	if strings.EqualFold(host, "localhost") {
		return true
	}
	addr, err := netip.ParseAddr(host)
	return err == nil && addr.IsLoopback()
}

// readTokens reads a token file: one token a line, blank lines and lines
// starting with # skipped.
func readTokens(path string) ([]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		out = append(out, line)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s holds no token", path)
	}
	return out, nil
}

// namedToken reads a token file's NAME:TOKEN line; ok is false for a
// bare token (no colon, or what precedes the first colon is not a tenant
// name, as in a token that holds a colon of its own).
func namedToken(line string) (api.NamedToken, bool) {
	name, tok, ok := strings.Cut(line, ":")
	if !ok || !api.ValidTenantName(name) {
		return api.NamedToken{}, false
	}
	return api.NamedToken{Name: name, Token: strings.TrimSpace(tok)}, true
}

// stringList is a comma-separated flag, repeatable.
type stringList []string

func (l *stringList) String() string {
	if l == nil || len(*l) == 0 {
		return ""
	}
	return fmt.Sprintf("%d values", len(*l)) // tokens are never printed
}

func (l *stringList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*l = append(*l, s)
		}
	}
	return nil
}

// prefixList is a comma-separated list of CIDR prefixes (an address alone
// is its /32 or /128).
type prefixList []netip.Prefix

func (l *prefixList) String() string {
	if l == nil {
		return ""
	}
	parts := make([]string, len(*l))
	for i, p := range *l {
		parts[i] = p.String()
	}
	return strings.Join(parts, ",")
}

func (l *prefixList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !strings.Contains(s, "/") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return fmt.Errorf("%q is not a prefix or address", s)
			}
			*l = append(*l, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return fmt.Errorf("%q is not a prefix: %v", s, err)
		}
		*l = append(*l, p.Masked())
	}
	return nil
}
