package api

import (
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http"
	"strings"
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
	// MetricsAuth puts /metrics behind the admin tokens. False (the
	// default) keeps Prometheus scraping unchanged.
	MetricsAuth bool
}

// errUnauthorized is a request without a valid bearer token.
var errUnauthorized = errors.New("a valid bearer token is required")

// authRealm is the WWW-Authenticate challenge of every 401.
const authRealm = `Bearer realm="kvroute"`

// tokenSet holds the digests of one class of tokens.
type tokenSet struct {
	digests [][sha256.Size]byte
}

func newTokenSet(what string, tokens []string) (tokenSet, error) {
	var ts tokenSet
	for i, t := range tokens {
		if len(t) < MinTokenBytes {
			return ts, fmt.Errorf("api: %s token %d is shorter than %d bytes", what, i, MinTokenBytes)
		}
		if strings.TrimSpace(t) != t {
			return ts, fmt.Errorf("api: %s token %d has leading or trailing white space", what, i)
		}
		ts.digests = append(ts.digests, sha256.Sum256([]byte(t)))
	}
	return ts, nil
}

// open reports whether the set guards nothing.
func (ts tokenSet) open() bool { return len(ts.digests) == 0 }

// match reports whether presented is one of the set's tokens. Every
// digest is compared, whichever matches.
func (ts tokenSet) match(presented []byte) bool {
	d := sha256.Sum256(presented)
	ok := 0
	for i := range ts.digests {
		ok |= subtle.ConstantTimeCompare(d[:], ts.digests[i][:])
	}
	return ok == 1
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
					if ts.match(tok) {
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
	return ok && (s.admin.match(tok) || s.apiTok.match(tok))
}
