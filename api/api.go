// Package api is kvroute's HTTP surface: routing decisions (POST /v1/route),
// the OpenAI-compatible proxy, the replica registry, health and metrics. It
// only translates HTTP to calls on router.Router and the registry and back;
// decisions are made by the router, and nothing below this package knows
// HTTP.
package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/router"
)

// Defaults for the zero values of Config.
const (
	DefaultMaxBodyBytes = 8 << 20
	DefaultMaxTokens    = 1_000_000
	DefaultTimeout      = 2 * time.Second
	// DefaultMaxOutputTokens bounds max_tokens (and the proxy's
	// max_completion_tokens): the largest output context of the models
	// vLLM serves today, and a booking one request can make.
	DefaultMaxOutputTokens = 131072
	// DefaultProxyRetries is how many other replicas a proxied request
	// tries when its replica fails before answering.
	DefaultProxyRetries = 2
	// DefaultSuspectTTL is how long a replica that failed a proxied
	// request is skipped by decisions (while other replicas are
	// routable): about the ingestor's probe interval, after which its
	// health check says what is true.
	DefaultSuspectTTL = 10 * time.Second
)

// Registry is what the admin endpoints need from the state store. It is
// declared here, where it is used, so that api depends on no store package
// and its tests run on an in-memory fake.
type Registry interface {
	// PutReplica adds or replaces a replica (PUT /v1/replicas/{id}); r is
	// validated before it gets here.
	PutReplica(ctx context.Context, r kvroute.Replica) error
	// GetReplica returns an error wrapping kvroute.ErrNotFound when id is
	// not registered.
	GetReplica(ctx context.Context, id string) (kvroute.Replica, error)
	// DeleteReplica removes the replica and what the index holds for it;
	// it returns an error wrapping kvroute.ErrNotFound when id is not
	// registered.
	DeleteReplica(ctx context.Context, id string) error
	// ListReplicas returns every registered replica, sorted by ID.
	ListReplicas(ctx context.Context) ([]kvroute.Replica, error)
	// Stats describes what the index holds for one replica of model.
	Stats(ctx context.Context, model, id string) (kvroute.ReplicaStats, error)
	// Loads returns, per replica in order, the load booked on it.
	Loads(ctx context.Context, model string, replicas []string) ([]kvroute.Load, error)
}

// Config wires a Server. Router and Registry are required; every other zero
// value gets a working default.
type Config struct {
	Router   *router.Router
	Registry Registry
	// Ready reports whether the pod can serve (typically: the store
	// answers). Nil means always ready.
	Ready func(ctx context.Context) error
	// Logger receives request errors and the proxy's copy errors; nil
	// discards them.
	Logger *slog.Logger
	// MaxBodyBytes bounds every request body; larger bodies get 413.
	// Zero means DefaultMaxBodyBytes.
	MaxBodyBytes int64
	// MaxTokens bounds the token ids of one request, which bounds the
	// work one decision can cost the store. Zero means DefaultMaxTokens.
	MaxTokens int
	// Timeout is the deadline of every non-proxy request (decisions,
	// progress reports, admin) and of the decision step of a proxied
	// request. Proxied responses themselves have no overall deadline: a
	// long generation is not an error. Zero means DefaultTimeout.
	Timeout time.Duration
	// Metrics serves /metrics: the wiring's exposition of its meter
	// provider (internal/app serves the Prometheus exporter's registry),
	// behind MetricsAuth. Nil means /metrics answers 404, for an embedder
	// that exposes its metrics elsewhere.
	Metrics http.Handler
	// MeterProvider receives the API's metrics (metrics.go), through the
	// OpenTelemetry API; the wiring's (internal/telemetry) exports them
	// into the registry Metrics serves. Nil means the global provider, a
	// no-op unless the program sets one.
	MeterProvider metric.MeterProvider
	// TracerProvider makes the API's spans, and is handed to nothing
	// else (the router has its own option). Nil means the global
	// provider.
	TracerProvider trace.TracerProvider
	// Propagator reads the caller's trace context (traceparent) and
	// writes it into proxied requests; nil means W3C trace context and
	// baggage.
	Propagator propagation.TextMapPropagator
	// Prompts tokenizes text and chat prompts; nil means none can be,
	// and their decisions are cache-blind (token ids still work).
	Prompts Prompts
	// NoTokenForwarding keeps a completion's text prompt as the client
	// sent it. By default (false) a text prompt kvroute tokenized itself
	// is forwarded as those ids, so the engine skips tokenizing and
	// caches exactly the blocks kvroute keyed.
	NoTokenForwarding bool
	// Transport carries proxied requests to replicas, as
	// httputil.ReverseProxy's does; nil means package dialer's transport
	// enforcing ReplicaPolicy on the resolved address (internal/app gives
	// the process's one Dialer's). No overall timeout applies: a streamed
	// generation may run for minutes.
	Transport http.RoundTripper
	// Access holds the bearer tokens of the admin API, the decision API
	// and the proxy, and whether /metrics needs one; its zero value
	// leaves every endpoint open.
	Access
	// ReplicaPolicy says which addresses a registered replica may point
	// at (PUT /v1/replicas/{id}; the proxy's default dialer too); the
	// zero value refuses link-local and metadata addresses.
	ReplicaPolicy kvroute.AddressPolicy
	// MaxOutputTokens bounds a request's max_tokens (and the proxy's
	// max_completion_tokens), which sizes its booking; a larger value is a
	// 400 naming the field. Zero means DefaultMaxOutputTokens.
	MaxOutputTokens int
	// ProxyRetries is how many other replicas a proxied request tries
	// when its replica fails before any response byte (connection
	// refused or reset); zero means DefaultProxyRetries, negative none.
	ProxyRetries int
	// ProxyHeaderTimeout bounds how long a proxied streaming request
	// waits for its replica's response headers (vLLM sends a stream's at
	// once), and is the floor of a non-streaming request's bound
	// (headerBound, bound.go). A replica that misses it is marked suspect
	// and the request fails over as if refused. Zero means
	// DefaultProxyHeaderTimeout; negative, no bound.
	ProxyHeaderTimeout time.Duration
	// ProxyResponseFactor multiplies a non-streaming request's predicted
	// duration (prompt over PrefillTPS plus max_tokens over DecodeTPS)
	// in its bound; zero means DefaultProxyResponseFactor.
	ProxyResponseFactor float64
	// PrefillTPS and DecodeTPS are the router's engine speeds
	// (router.Config), which predict a non-streaming request's duration
	// as they predict its booking's; zero means router.DefaultConfig()'s.
	PrefillTPS, DecodeTPS float64
	// PinRecorder is where the pin check (pincheck.go) records a
	// data-parallel replica whose engines ignore the rank header, for
	// every pod to stop pinning it; nil means Registry when it is one,
	// else the check only logs and counts.
	PinRecorder PinRecorder
	// SuspectTTL is how long such a replica is skipped by this pod's
	// decisions while others are routable; zero means
	// DefaultSuspectTTL.
	SuspectTTL time.Duration
	// AccessLog says which requests get an access-log line; zero means
	// AccessLogSampled: every error, and one in AccessLogEvery of the
	// rest.
	AccessLog AccessLogMode
	// AccessLogEvery is the sampled mode's one line in so many
	// successful requests; zero means DefaultAccessLogEvery.
	AccessLogEvery int
	// MaxQueueWait is the longest the router may keep a request waiting
	// for admission (its queue's TTL): a decision's deadline is Timeout
	// plus the request's wait, at most this. Zero means
	// admission.DefaultTTL; negative, requests do not wait (admission
	// is off).
	MaxQueueWait time.Duration

	// route is Router.Route unless a test stands in for it
	// (export_test.go): the router's queue is not the API's to test.
	route func(context.Context, router.Request) (router.Decision, error)
}

// Server is the HTTP handler. Build it with New.
type Server struct {
	cfg     Config
	rt      *router.Router
	reg     Registry
	log     *slog.Logger
	m       *metrics
	tracer  trace.Tracer
	handler http.Handler
	prompts Prompts
	proxy   http.RoundTripper
	// pins verifies that data-parallel replicas honour their pins.
	pins *PinCheck
	// proxyLog carries httputil.ReverseProxy's own messages (a stream
	// cut mid-copy) to slog instead of the standard log package.
	proxyLog *log.Logger
	// admin and apiTok are the Access tokens' digests.
	admin, apiTok tokenSet
	// noPriority holds the replicas (id: URL) that answered a forwarded
	// priority with vLLM's "not enabled" 400 although registered with
	// PriorityScheduling: they get the bare body until their
	// registration changes (priority.go).
	noPriority sync.Map
	// accessSeen counts the successful requests the sampled access log
	// has seen.
	accessSeen atomic.Uint64
}

// New checks cfg, registers the metrics and builds the routes.
func New(cfg Config) (*Server, error) {
	if cfg.Router == nil {
		return nil, errors.New("api: Config.Router is required")
	}
	if cfg.Registry == nil {
		return nil, errors.New("api: Config.Registry is required")
	}
	cfg.defaults()
	if _, err := ParseAccessLogMode(string(cfg.AccessLog)); err != nil {
		return nil, fmt.Errorf("api: Config.AccessLog: %w", err)
	}
	cfg.telemetry()
	m, err := newMetrics(cfg.MeterProvider, cfg.Registry)
	if err != nil {
		return nil, fmt.Errorf("api: metrics: %w", err)
	}
	s := &Server{cfg: cfg, rt: cfg.Router, reg: cfg.Registry, log: cfg.Logger, m: m, proxy: cfg.Transport,
		tracer:   cfg.TracerProvider.Tracer(tracerName),
		proxyLog: slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)}
	if s.proxy == nil {
		s.proxy = guardedTransport(cfg.ReplicaPolicy)
	}
	if s.admin, err = newTokenSet("admin", cfg.AdminTokens); err != nil {
		return nil, err
	}
	if s.apiTok, err = newTokenSet("API", cfg.APITokens, cfg.NamedAPITokens...); err != nil {
		return nil, err
	}
	if h := cfg.TenantHeader; h != "" && !validHeaderName(h) {
		return nil, fmt.Errorf("api: TenantHeader %q is not a header name", h)
	}
	if s.prompts = cfg.Prompts; s.prompts == nil {
		if s.prompts, err = prompt.New(prompt.Config{}); err != nil {
			return nil, fmt.Errorf("api: %w", err)
		}
	}
	if cfg.PinRecorder == nil {
		cfg.PinRecorder, _ = cfg.Registry.(PinRecorder)
	}
	s.pins = NewPinCheck(cfg.PinRecorder, cfg.Logger, func(ctx context.Context, replica string) {
		m.pinIgnored.Add(ctx, 1, label("replica", replica))
	}, s.rt.Invalidate)
	s.handler = s.routes()
	return s, nil
}

// defaults gives every zero value its working default.
func (cfg *Config) defaults() {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = DefaultMaxBodyBytes
	}
	if cfg.MaxTokens <= 0 {
		cfg.MaxTokens = DefaultMaxTokens
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = DefaultTimeout
	}
	if cfg.MaxOutputTokens <= 0 {
		cfg.MaxOutputTokens = DefaultMaxOutputTokens
	}
	switch {
	case cfg.ProxyRetries == 0:
		cfg.ProxyRetries = DefaultProxyRetries
	case cfg.ProxyRetries < 0:
		cfg.ProxyRetries = 0
	}
	if cfg.SuspectTTL <= 0 {
		cfg.SuspectTTL = DefaultSuspectTTL
	}
	// The header bound's factors, set once here rather than per request.
	if cfg.ProxyResponseFactor <= 0 {
		cfg.ProxyResponseFactor = DefaultProxyResponseFactor
	}
	if def := router.DefaultConfig(); cfg.PrefillTPS <= 0 || cfg.DecodeTPS <= 0 {
		cfg.PrefillTPS = cmp.Or(max(cfg.PrefillTPS, 0), def.PrefillTPS)
		cfg.DecodeTPS = cmp.Or(max(cfg.DecodeTPS, 0), def.DecodeTPS)
	}
	if cfg.AccessLog == "" {
		cfg.AccessLog = AccessLogSampled
	}
	if cfg.AccessLogEvery <= 0 {
		cfg.AccessLogEvery = DefaultAccessLogEvery
	}
	switch {
	case cfg.MaxQueueWait == 0:
		cfg.MaxQueueWait = admission.DefaultTTL
	case cfg.MaxQueueWait < 0:
		cfg.MaxQueueWait = 0
	}
	if cfg.route == nil {
		cfg.route = cfg.Router.Route
	}
	if cfg.Ready == nil {
		cfg.Ready = func(context.Context) error { return nil }
	}
}

// ServeHTTP makes Server an http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.handler.ServeHTTP(w, r) }

func (s *Server) routes() http.Handler {
	r := chi.NewRouter()
	r.Use(middleware.RequestID, s.accessLog, s.recoverer)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, fmt.Errorf("no such endpoint %s %s: %w", r.Method, r.URL.Path, kvroute.ErrNotFound))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		s.m.apiError(r.Context(), CodeMethod)
		writeJSON(w, http.StatusMethodNotAllowed, ErrorBody{Error: ErrorDetail{Code: CodeMethod, Message: r.Method + " is not allowed on " + r.URL.Path}})
	})

	// Probes never need a token: orchestrators call them.
	r.Get("/healthz", s.healthz)
	r.Get("/readyz", s.readyz)
	if metrics := s.cfg.Metrics; metrics != nil {
		if s.cfg.MetricsAuth {
			metrics = s.guard(s.admin)(metrics)
		}
		r.Method(http.MethodGet, "/metrics", metrics)
	}

	// The decision API and the proxy are open without API tokens; with
	// them, an admin token opens them too.
	admin, client := s.guard(s.admin), s.guard(s.apiTok)
	if !s.apiTok.open() {
		client = s.guard(s.admin, s.apiTok)
	}
	// Everything but the proxy answers within Timeout: a decision that
	// takes longer than that is worth less than a fast error. A decision
	// may also wait for admission as long as it asked, so /v1/route sets
	// its own deadline (decisionTimeout).
	r.With(client).Post("/v1/route", s.route)
	r.Group(func(r chi.Router) {
		r.Use(s.timeout)
		r.With(client).Post("/v1/requests/{id}/first-token", s.firstToken)
		r.With(client).Post("/v1/requests/{id}/release", s.release)
		r.With(client).Get("/v1/models", s.listModels)
		r.With(admin).Get("/v1/replicas", s.listReplicas)
		r.With(admin).Get("/v1/replicas/{id}", s.getReplica)
		r.With(admin).Put("/v1/replicas/{id}", s.putReplica)
		r.With(admin).Delete("/v1/replicas/{id}", s.deleteReplica)
	})
	r.With(client).Post("/v1/completions", s.proxyOpenAI)
	r.With(client).Post("/v1/chat/completions", s.proxyOpenAI)
	return r
}

// timeout bounds the request's context; the store and router honour it.
func (s *Server) timeout(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
		defer cancel()
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// recoverer turns a handler panic into a logged JSON 500 instead of a
// dropped connection. http.ErrAbortHandler is re-panicked: the reverse
// proxy uses it to abort a stream whose upstream failed mid-body, and the
// server must then close the connection rather than append a body.
func (s *Server) recoverer(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			rec := recover()
			if rec == nil {
				return
			}
			if rec == http.ErrAbortHandler {
				panic(rec)
			}
			s.log.ErrorContext(r.Context(), "panic in handler", "path", r.URL.Path, "panic", rec)
			s.m.apiError(r.Context(), CodeInternal)
			writeJSON(w, http.StatusInternalServerError, ErrorBody{Error: ErrorDetail{Code: CodeInternal, Message: "internal error"}})
		}()
		next.ServeHTTP(w, r)
	})
}

// healthz says only that the process serves HTTP; orchestrators restart a
// pod that fails it, so it must not depend on Redis.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
}

// readyz says whether this pod should receive traffic: a pod that cannot
// reach the store is taken out of the load balancer rather than restarted.
func (s *Server) readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
	defer cancel()
	if err := s.cfg.Ready(ctx); err != nil {
		s.m.apiError(r.Context(), CodeNotReady)
		writeJSON(w, http.StatusServiceUnavailable, ErrorBody{Error: ErrorDetail{Code: CodeNotReady, Message: err.Error()}})
		return
	}
	writeJSON(w, http.StatusOK, map[string]string{"status": "ready"})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}
