// Package app builds kvroute's processes from their configuration and runs
// each the way Prometheus's main does: every component is an
// execute/interrupt pair in one run group, and the first one to return
// stops them all. `kvroute serve` is the store (real Redis, or an embedded
// one), the router, the HTTP API and server, and companion tasks (the
// embedded ingestor, demo replicas); `kvroute ingest` is the store, the
// ingestor and its metrics server. It lives apart from cmd/kvroute so that
// end-to-end tests run exactly the wiring production runs, in-process.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/dialer"
	"github.com/kvroute/kvroute/internal/telemetry"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/store"
)

// Config is everything `kvroute serve` is configured with.
type Config struct {
	// Listen is the HTTP address; port 0 picks a free port (see Addr).
	Listen string
	// RedisURL is the state store. Empty runs an embedded in-memory Redis
	// (miniredis) in this process: zero setup, but nothing is shared with
	// other pods and everything is lost on exit.
	RedisURL string
	// Redis is the full store setting (Sentinel, Cluster, ACL user,
	// password file, TLS files); when configured it wins over RedisURL.
	// The zero value defers to RedisURL.
	Redis  store.Config
	Router router.Config
	// Pod names this process to the admission queue (router.Options.Pod);
	// empty means a random id.
	Pod string
	// ReplicasFile, when set, is a JSON array of kvroute.Replica written
	// to the registry at start (replacing entries with the same ids).
	ReplicasFile string
	// Tokenizers says where text and chat prompts are tokenized.
	Tokenizers Tokenizers
	// MaxBodyBytes, MaxTokens and RequestTimeout are the API's limits;
	// zero values get api's defaults.
	MaxBodyBytes   int64
	MaxTokens      int
	RequestTimeout time.Duration
	// Access (bearer tokens), ReplicaPolicy (where a replica's addresses
	// may point: the admin API, the replicas file and the proxy's dialer),
	// MaxOutputTokens and ProxyRetries are the API's (see api.Config);
	// zero values get its defaults.
	Access          api.Access
	ReplicaPolicy   kvroute.AddressPolicy
	MaxOutputTokens int
	ProxyRetries    int
	// ProxyHeaderTimeout and ProxyResponseFactor bound how long a
	// proxied request waits for its replica's headers (see api.Config;
	// the router's PrefillTPS and DecodeTPS predict its duration); zero
	// values get api's defaults.
	ProxyHeaderTimeout  time.Duration
	ProxyResponseFactor float64
	// Dialer makes every connection to a replica: the proxy's, remote
	// tokenization's and the embedded ingestor's (probes, ZeroMQ). Nil
	// means dialer.New(ReplicaPolicy, Logger); tests give one with an
	// injected resolver, whose Policy is then the one enforced at connect
	// time (ReplicaPolicy still checks registrations).
	Dialer *dialer.Dialer
	// AccessLog and AccessLogEvery say which requests get an access-log
	// line (api.Config's fields of those names); zero values mean the
	// API's defaults: every error and one in a hundred of the rest.
	AccessLog      api.AccessLogMode
	AccessLogEvery int
	// ShutdownTimeout bounds the graceful drain of in-flight requests
	// (proxied streams included) on Stop; default 10s.
	ShutdownTimeout time.Duration
	// Logger receives every component's logs; nil discards them.
	Logger *slog.Logger
	// Tasks run alongside the server, from Start until Stop, over the same
	// store: the embedded ingestor (in the no-Redis mode), demo replicas.
	// Routing depends on them, so a task that ends before Stop, with an
	// error or without, makes /readyz fail at once and stops the process
	// FailDelay later, with an error.
	Tasks []Task
	// FailDelay is how long a pod whose task died keeps answering (with
	// /readyz failing) before it exits, so that a load balancer takes it
	// out of rotation first; zero means 2 s.
	FailDelay time.Duration
}

// Task is a companion of the server. Run gets the built App to share its
// store and metrics registry, and must return when ctx is done.
type Task struct {
	// Name identifies the task in logs and in /readyz.
	Name string
	Run  func(ctx context.Context, a *App) error
	// Warms, when set, holds /readyz failing from Start until the task
	// calls App.Warmed: for a task without which the first decisions
	// would be wrong, not only slow (the demo replicas, registered a
	// moment after the port is up). False: the task does not hold it.
	Warms bool
}

// App is a built serve process. New builds it, Start serves, Stop drains.
type App struct {
	cfg Config
	log *slog.Logger
	// Store, Router and Registry are exposed so that embedders (the
	// ingestor wiring, tests) share them instead of building their own.
	Store    *store.Store
	Router   *router.Router
	Registry *prometheus.Registry
	API      *api.Server
	Prompts  *prompt.Resolver
	// Dialer is Config.Dialer or the one built from ReplicaPolicy.
	Dialer *dialer.Dialer

	srv      *http.Server
	ln       net.Listener
	stop     chan struct{}
	stopOnce sync.Once
	// done is closed when the run group has ended, with runErr its result.
	done   chan struct{}
	runErr error
	// drainErr is the HTTP server's graceful shutdown result.
	drainErr error
	// failed holds the first task failure; /readyz reports it.
	failed atomic.Pointer[error]
	// warming holds the names of the Warms tasks that have not called
	// Warmed yet; /readyz fails while it is not empty.
	warmMu  sync.Mutex
	warming map[string]bool
	// tel is the OpenTelemetry SDK (telemetry.go).
	tel *telemetry.Telemetry
}

// New builds every component and loads the replicas file, but does not
// listen yet: a bad address or an unreachable Redis fails here, before
// the process claims to be up.
func New(ctx context.Context, cfg Config) (_ *App, err error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ShutdownTimeout <= 0 {
		cfg.ShutdownTimeout = 10 * time.Second
	}
	if cfg.FailDelay <= 0 {
		cfg.FailDelay = 2 * time.Second
	}
	if cfg.Dialer == nil {
		cfg.Dialer = dialer.New(cfg.ReplicaPolicy, cfg.Logger.With("component", "dialer"))
	}
	a := &App{cfg: cfg, log: cfg.Logger, stop: make(chan struct{}), Dialer: cfg.Dialer}
	defer func() {
		if err != nil && a.Store != nil {
			_ = a.Store.Close()
		}
	}()

	if err := a.setupTelemetry(ctx); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = a.shutdownTelemetry()
		}
	}()
	sopt := store.Options{Logger: a.log}
	rc := cfg.Redis
	if !rc.Configured() && cfg.RedisURL != "" {
		rc = store.Config{URL: cfg.RedisURL}
	}
	if !rc.Configured() {
		var addr string
		if a.Store, addr, err = store.OpenEmbedded(ctx, sopt); err != nil {
			return nil, err
		}
		a.log.Warn("no Redis URL given: running on an embedded in-memory Redis (miniredis); state is lost on exit and not shared with other pods",
			"addr", addr)
	} else if a.Store, err = store.OpenConfig(ctx, rc, sopt); err != nil {
		return nil, err
	}
	if err = a.countStoreErrors(); err != nil {
		return nil, err
	}
	if a.Router, err = router.New(a.Store, a.Store, cfg.Router, router.Options{Logger: a.log, OnStoreReset: a.reseed,
		TracerProvider: a.tel.TracerProvider, MeterProvider: a.tel.MeterProvider, Pod: cfg.Pod}); err != nil {
		return nil, err
	}
	if err = a.registerFile(ctx); err != nil {
		return nil, err
	}
	if err = a.observeRouter(); err != nil {
		return nil, err
	}
	if a.Prompts, err = a.buildPrompts(cfg.Tokenizers); err != nil {
		return nil, err
	}
	if a.API, err = api.New(a.apiConfig()); err != nil {
		return nil, err
	}
	a.srv = &http.Server{
		Handler:           a.API,
		ReadHeaderTimeout: 10 * time.Second,
		// No ReadTimeout or WriteTimeout: proxied generations stream for
		// as long as they take. Idle keep-alive connections are bounded.
		IdleTimeout: 2 * time.Minute,
		ErrorLog:    slog.NewLogLogger(a.log.Handler(), slog.LevelWarn),
	}
	return a, nil
}

// registerFile registers the replicas of Config.ReplicasFile, each checked
// against the address policy first, as on the admin API.
func (a *App) registerFile(ctx context.Context) error {
	if a.cfg.ReplicasFile == "" {
		return nil
	}
	reps, err := LoadReplicasFile(a.cfg.ReplicasFile)
	if err != nil {
		return err
	}
	for i, r := range reps {
		// The address policy is the operator's, as on the admin API.
		if err := a.cfg.ReplicaPolicy.Check(r); err != nil {
			return fmt.Errorf("replicas file %s: entry %d: %w", a.cfg.ReplicasFile, i, err)
		}
	}
	for _, r := range reps {
		if err := a.Store.PutReplica(ctx, r); err != nil {
			return fmt.Errorf("replicas file: %s: %w", r.ID, err)
		}
	}
	a.log.Info("registered replicas from file", "file", a.cfg.ReplicasFile, "count", len(reps))
	return nil
}

// apiConfig is the HTTP API's configuration, from the App's and its parts.
func (a *App) apiConfig() api.Config {
	return api.Config{
		Router:            a.Router,
		Registry:          a.Store,
		Prompts:           a.Prompts,
		NoTokenForwarding: a.cfg.Tokenizers.NoTokenForwarding,
		Ready:             a.ready,
		Logger:            a.log,
		MaxBodyBytes:      a.cfg.MaxBodyBytes,
		MaxTokens:         a.cfg.MaxTokens,
		Timeout:           a.cfg.RequestTimeout,
		AccessLog:         a.cfg.AccessLog,
		AccessLogEvery:    a.cfg.AccessLogEvery,
		Access:            a.cfg.Access,
		ReplicaPolicy:     a.cfg.ReplicaPolicy,
		Transport:         a.Dialer.Transport(),
		MaxOutputTokens:   a.cfg.MaxOutputTokens,
		ProxyRetries:      a.cfg.ProxyRetries,
		MaxQueueWait:      maxQueueWait(a.cfg.Router.Admission),
		Metrics:           promhttp.HandlerFor(a.Registry, promhttp.HandlerOpts{}),
		MeterProvider:     a.tel.MeterProvider,
		TracerProvider:    a.tel.TracerProvider,
		Propagator:        a.tel.Propagator,

		// How long a proxied request waits for its replica's headers.
		ProxyHeaderTimeout:  a.cfg.ProxyHeaderTimeout,
		ProxyResponseFactor: a.cfg.ProxyResponseFactor,
		PrefillTPS:          a.cfg.Router.PrefillTPS,
		DecodeTPS:           a.cfg.Router.DecodeTPS,
	}
}

// reseed writes this pod's last copy of the registry back into a store
// that lost its data, so that the ingestors follow the replicas again and
// rebuild the index from their replay buffers. Each replica is written
// without followed_since, since its index is empty until an ingestor has
// replayed it: decisions say index_incomplete until the ingestor marks it
// followed again. A replica is written only where the registry has none:
// every pod that noticed re-seeds, and a later pod's copy must not undo
// what an ingestor or an operator wrote since. A replica deleted
// meanwhile by another pod's admin call would come back; that window is a
// second.
func (a *App) reseed(ctx context.Context, known []kvroute.Replica) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	n := 0
	for _, rep := range known {
		rep.FollowedSince = time.Time{}
		err := a.Store.EditReplica(ctx, rep.ID, func(r *kvroute.Replica, found bool) (bool, error) {
			if found {
				return false, nil
			}
			*r = rep
			return true, nil
		})
		if err != nil {
			a.log.Warn("re-seed replica", "replica", rep.ID, "err", err)
			continue
		}
		n++
	}
	a.log.Warn("re-seeded the registry into a store that lost its data", "replicas", n, "of", len(known))
}

// ready is /readyz: this pod can answer decisions. Every task routing
// depends on is alive, every Warms task has said it is warm, and the
// store answers or, while it does not, the pod knows a fleet to route
// over degraded. The store's own state is
// kvroute_store_up in /metrics, not readiness: every pod would fail
// readiness together when the store hiccups, and degraded mode would
// never serve.
func (a *App) ready(ctx context.Context) error {
	if err := a.failed.Load(); err != nil {
		return *err
	}
	a.warmMu.Lock()
	var warming []string
	for name := range a.warming {
		warming = append(warming, name)
	}
	a.warmMu.Unlock()
	if len(warming) > 0 {
		slices.Sort(warming)
		return fmt.Errorf("starting: %s", strings.Join(warming, ", "))
	}
	return a.Router.CanDecide(ctx)
}

// Warmed tells readiness that the Warms task name has done what the first
// decisions need; other callers and later calls change nothing.
func (a *App) Warmed(name string) {
	a.warmMu.Lock()
	defer a.warmMu.Unlock()
	delete(a.warming, name)
}

// Start listens, then runs the server and the tasks as one run group in
// the background; Served reports when the group ends.
func (a *App) Start() error {
	ln, err := net.Listen("tcp", a.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	a.ln = ln
	var g run.Group
	g.Add(func() error {
		<-a.stop
		return nil
	}, func(error) { a.interrupt() })
	g.Add(func() error {
		if err := a.srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serve: %w", err)
		}
		return nil
	}, func(error) {
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
		defer cancel()
		if err := a.srv.Shutdown(ctx); err != nil {
			a.drainErr = errors.Join(fmt.Errorf("shutdown: %w", err), a.srv.Close())
		}
	})
	// Progress reports the store could not take are retried in the
	// background; the retrier is a task like any other.
	tasks := append([]Task{
		{Name: "progress-reports", Run: func(ctx context.Context, a *App) error { return a.Router.Run(ctx) }},
		// A Redis that lost its data is noticed within a second, with or
		// without traffic, and the registry written back (reseed).
		{Name: "store-epoch", Run: func(ctx context.Context, a *App) error { return a.Router.RunEpochCheck(ctx, time.Second) }},
	}, a.cfg.Tasks...)
	a.warmMu.Lock()
	a.warming = map[string]bool{}
	for _, t := range tasks {
		if t.Warms {
			a.warming[t.Name] = true
		}
	}
	a.warmMu.Unlock()
	for _, t := range tasks {
		ctx, cancel := context.WithCancel(context.Background())
		g.Add(func() error { return a.runTask(ctx, t) }, func(error) { cancel() })
	}
	a.done = make(chan struct{})
	go func() {
		a.runErr = g.Run()
		close(a.done)
	}()
	a.log.Info("serving", "addr", ln.Addr().String(), "policy", a.cfg.Router.Scoring.Policy, "block_size", a.cfg.Router.BlockSize)
	return nil
}

// runTask runs one task. Ending before Stop is a failure whatever the
// task returned: readiness fails at once, and after FailDelay (so that
// load balancers stop sending first) the error stops the group.
func (a *App) runTask(ctx context.Context, t Task) error {
	err := t.Run(ctx, a)
	if ctx.Err() != nil {
		return nil
	}
	if err == nil {
		err = errors.New("ended")
	}
	err = fmt.Errorf("task %s: %w", t.Name, err)
	a.failed.CompareAndSwap(nil, &err)
	a.log.Error("a task routing depends on died: failing readiness, then stopping", "task", t.Name, "err", err, "in", a.cfg.FailDelay)
	select {
	case <-time.After(a.cfg.FailDelay):
	case <-ctx.Done():
	}
	return err
}

func (a *App) interrupt() { a.stopOnce.Do(func() { close(a.stop) }) }

// Addr is the address the server listens on, once started.
func (a *App) Addr() string {
	if a.ln == nil {
		return ""
	}
	return a.ln.Addr().String()
}

// Done is closed when the process's run group has ended: after Stop, or
// when a component failed (Err says which).
func (a *App) Done() <-chan struct{} { return a.done }

// Err is the error of the component that ended the run group, nil after a
// clean Stop; it is meaningful once Done is closed.
func (a *App) Err() error { return a.runErr }

// Stop drains in-flight requests for up to ShutdownTimeout, stops the
// tasks and closes the store. It is safe to call on an App never started.
func (a *App) Stop() error {
	var err error
	if a.done != nil {
		a.interrupt()
		<-a.done
		err = a.runErr
	}
	if a.Prompts != nil {
		a.Prompts.Close()
	}
	if a.Store != nil {
		_ = a.Store.Close()
	}
	// After the drain: the last requests' spans are flushed too.
	return errors.Join(err, a.drainErr, a.shutdownTelemetry())
}

// Run serves until ctx is done or a component fails, then stops. It
// returns nil after a clean shutdown, else the failure.
func Run(ctx context.Context, cfg Config) error {
	a, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	if err := a.Start(); err != nil {
		_ = a.Stop()
		return err
	}
	select {
	case <-ctx.Done():
		a.log.Info("shutting down", "timeout", a.cfg.ShutdownTimeout)
	case <-a.done:
	}
	return a.Stop()
}

// LoadReplicasFile reads a JSON array of replicas and validates each, so
// that a typo fails the start instead of leaving a replica unroutable.
// Where their addresses may point is New's to check (Config.ReplicaPolicy).
func LoadReplicasFile(path string) ([]kvroute.Replica, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("replicas file: %w", err)
	}
	defer f.Close()
	dec := json.NewDecoder(f)
	dec.DisallowUnknownFields()
	var reps []kvroute.Replica
	if err := dec.Decode(&reps); err != nil {
		return nil, fmt.Errorf("replicas file %s: %w", path, err)
	}
	seen := map[string]bool{}
	for i, r := range reps {
		if err := r.Validate(); err != nil {
			return nil, fmt.Errorf("replicas file %s: entry %d: %w", path, i, err)
		}
		if seen[r.ID] {
			return nil, fmt.Errorf("replicas file %s: entry %d: duplicate id %q", path, i, r.ID)
		}
		seen[r.ID] = true
	}
	return reps, nil
}

// maxQueueWait is the longest a decision may wait for admission: the
// queue's TTL or the cold-start wait, whichever is longer; negative (no
// wait) with admission off.
func maxQueueWait(c admission.Config) time.Duration {
	if !c.Enabled {
		return -1
	}
	return max(c.TTLOrDefault(), c.ColdStartWait())
}
