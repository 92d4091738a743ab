package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"regexp"
	"strings"

	"github.com/kvroute/kvroute"
)

// MinTokenBytes is the shortest bearer token New accepts: a token short
// enough to guess is no authentication.
const MinTokenBytes = 16

// Access says which bearer tokens open which endpoints. Tokens are
// compared in constant time (as SHA-256 digests, so that neither their
// contents nor their lengths leak through timing) and never logged. The
// zero value leaves every endpoint open: what tests and embedders on a
// private socket get; `kvroute serve` refuses to listen beyond loopback
// without admin tokens unless told --insecure-admin.
type Access struct {
	// AdminTokens open the admin API: the registry (GET, PUT and DELETE
	// /v1/replicas and /v1/replicas/{id}: its entries carry internal
	// addresses, and GET /v1/replicas/{id} the index and load state) and,
	// with MetricsAuth, /metrics. An admin token opens the decision API
	// and proxy too. Nil: the admin API is open.
	AdminTokens []string
	// APITokens open the decision API (/v1/route, progress reports,
	// /v1/models) and the OpenAI proxy. Nil: they are open. The proxy
	// does not forward a kvroute token to the replica.
	APITokens []string
	// NamedAPITokens open what APITokens open, and name the tenant the
	// requests they carry are charged to when they queue (the admission
	// queue shares a band fairly between tenants). A bare APIToken, and
	// an admin token, is the anonymous tenant "".
	NamedAPITokens []NamedToken
	// MetricsAuth puts /metrics behind the admin tokens. False (the
	// default) keeps Prometheus scraping unchanged.
	MetricsAuth bool
	// TenantHeader names a request header whose value is the tenant,
	// for an operator whose gateway in front of kvroute authenticates
	// clients and sets it; it wins over the token's name. Empty (the
	// default): no header is trusted, since any client could set one.
	// Its value must be a tenant name (TenantNamePattern).
	TenantHeader string
}

// NamedToken is a bearer token and the tenant it names.
type NamedToken struct {
	Name  string
	Token string
}

// TenantNamePattern is what a tenant name may be: short and plain, so
// that it is safe in a Redis key, a log line and a metric label.
const TenantNamePattern = `^[A-Za-z0-9._-]{1,64}$`

var tenantName = regexp.MustCompile(TenantNamePattern)

// ValidTenantName reports whether name matches TenantNamePattern.
func ValidTenantName(name string) bool { return tenantName.MatchString(name) }

// errUnauthorized is a request without a valid bearer token.
var errUnauthorized = errors.New("a valid bearer token is required")

// authRealm is the WWW-Authenticate challenge of every 401.
const authRealm = `Bearer realm="kvroute"`

// tokenSet holds the digests of one class of tokens, and the tenant each
// names ("" for none).
type tokenSet struct {
	digests [][sha256.Size]byte
	names   []string
}

func newTokenSet(what string, tokens []string, named ...NamedToken) (tokenSet, error) {
	var ts tokenSet
	all := make([]NamedToken, 0, len(tokens)+len(named))
	for _, t := range tokens {
		all = append(all, NamedToken{Token: t})
	}
	for i, t := range append(all, named...) {
		if len(t.Token) < MinTokenBytes {
			return ts, fmt.Errorf("api: %s token %d is shorter than %d bytes", what, i, MinTokenBytes)
		}
		if strings.TrimSpace(t.Token) != t.Token {
			return ts, fmt.Errorf("api: %s token %d has leading or trailing white space", what, i)
		}
		if i >= len(tokens) && !ValidTenantName(t.Name) {
			return ts, fmt.Errorf("api: %s token %d: its name must match %s", what, i, TenantNamePattern)
		}
		ts.digests = append(ts.digests, sha256.Sum256([]byte(t.Token)))
		ts.names = append(ts.names, t.Name)
	}
	return ts, nil
}

// open reports whether the set guards nothing.
func (ts tokenSet) open() bool { return len(ts.digests) == 0 }

// match reports whether presented is one of the set's tokens, and the
// name of the one it is. Every digest is compared, whichever matches, and
// the index is picked without a branch on the comparison, so that the
// time taken says nothing of which token (if any) matched.
func (ts tokenSet) match(presented []byte) (string, bool) {
	d := sha256.Sum256(presented)
	ok, at := 0, 0
	for i := range ts.digests {
		eq := subtle.ConstantTimeCompare(d[:], ts.digests[i][:])
		ok |= eq
		at = subtle.ConstantTimeSelect(eq, i, at)
	}
	if ok != 1 {
		return "", false
	}
	return ts.names[at], true
}

// tenantKey is the context key under which guard leaves the tenant its
// matched token names.
type tenantKey struct{}

// tokenTenant is the tenant the request's token names ("" for none).
func tokenTenant(ctx context.Context) string {
	name, _ := ctx.Value(tenantKey{}).(string)
	return name
}

// tenant is whom a request is charged to in the admission queue: the
// trusted header's value when the operator set one (TenantHeader) and
// the request carries it, else its token's name. A header value that is
// not a tenant name is a 400 naming the header.
func (s *Server) tenant(r *http.Request) (string, error) {
	if h := s.cfg.TenantHeader; h != "" {
		switch vals := r.Header.Values(h); {
		case len(vals) > 1:
			return "", &kvroute.FieldError{Field: h, Msg: "is given more than once"}
		case len(vals) == 1 && !ValidTenantName(vals[0]):
			return "", &kvroute.FieldError{Field: h, Msg: "must match " + TenantNamePattern}
		case len(vals) == 1:
			return vals[0], nil
		}
	}
	return tokenTenant(r.Context()), nil
}

// bearer is the token of an Authorization: Bearer header, if any.
func bearer(r *http.Request) ([]byte, bool) {
	h := r.Header.Get("Authorization")
	scheme, tok, ok := strings.Cut(h, " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return nil, false
	}
	tok = strings.TrimSpace(tok)
	return []byte(tok), tok != ""
}

// guard is the middleware requiring one of sets' tokens, or nothing when
// every set is open (then the class of endpoints is not guarded).
func (s *Server) guard(sets ...tokenSet) func(http.Handler) http.Handler {
	open := true
	for _, ts := range sets {
		open = open && ts.open()
	}
	return func(next http.Handler) http.Handler {
		if open {
			return next
		}
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			tok, ok := bearer(r)
			if ok {
				for _, ts := range sets {
					if name, ok := ts.match(tok); ok {
						if name != "" {
							r = r.WithContext(context.WithValue(r.Context(), tenantKey{}, name))
						}
						next.ServeHTTP(w, r)
						return
					}
				}
			}
			s.writeError(w, r, errUnauthorized)
		})
	}
}

// isKvrouteToken reports whether the request carries one of kvroute's own
// tokens, which the proxy must not pass on to a replica.
func (s *Server) isKvrouteToken(r *http.Request) bool {
	tok, ok := bearer(r)
	if !ok {
		return false
	}
	_, admin := s.admin.match(tok)
	_, client := s.apiTok.match(tok)
	return admin || client
}

// validHeaderName reports whether name is an HTTP field name (RFC 9110's
// token): a tenant header the operator misspelt with a space or colon
// would never match, and every request would be anonymous.
func validHeaderName(name string) bool {
	if name == "" {
		return false
	}
	for _, c := range []byte(name) {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9':
		case strings.IndexByte("!#$%&'*+-.^_`|~", c) >= 0:
		default:
			return false
		}
	}
	return true
}
