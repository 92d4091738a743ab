// Package app builds a `kvroute serve` process from its configuration: the
// store (real Redis, or an embedded miniredis), the router, the HTTP API and
// the HTTP server, and runs them as one start/stop pair. It lives apart from
// cmd/kvroute so that end-to-end tests run exactly the wiring production
// runs, in-process.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
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
	Router   router.Config
	// ReplicasFile, when set, is a JSON array of kvroute.Replica written
	// to the registry at start (replacing entries with the same ids).
	ReplicasFile string
	// MaxBodyBytes, MaxTokens and RequestTimeout are the API's limits;
	// zero values get api's defaults.
	MaxBodyBytes   int64
	MaxTokens      int
	RequestTimeout time.Duration
	// ShutdownTimeout bounds the graceful drain of in-flight requests
	// (proxied streams included) on Stop; default 10s.
	ShutdownTimeout time.Duration
	Logger          *slog.Logger
	// Tasks run alongside the server, from Start until Stop, over the same
	// store. This is where companions such as the embedded ingestor (in
	// the no-Redis mode) or demo replicas are plugged in; a task's error
	// is logged and does not stop the server.
	Tasks []Task
}

// Task is a companion of the server (the embedded ingestor, demo
// replicas); it gets the built App to share its store and metrics
// registry, and must return when ctx is done.
type Task func(ctx context.Context, a *App) error

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

	mini   *miniredis.Miniredis
	srv    *http.Server
	ln     net.Listener
	cancel context.CancelFunc
	wg     sync.WaitGroup
	served chan error
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
	a := &App{cfg: cfg, log: cfg.Logger}
	defer func() {
		if err != nil {
			a.closeStore()
		}
	}()

	url := cfg.RedisURL
	if url == "" {
		if a.mini, err = miniredis.Run(); err != nil {
			return nil, fmt.Errorf("embedded redis: %w", err)
		}
		url = "redis://" + a.mini.Addr()
		a.log.Warn("no Redis URL given: running on an embedded in-memory Redis (miniredis); state is lost on exit and not shared with other pods",
			"addr", a.mini.Addr())
	}
	ropt, err := redisOptions(url)
	if err != nil {
		return nil, err
	}
	a.Store = store.New(redis.NewClient(ropt), store.Options{Logger: a.log})
	if err := a.Store.Ping(ctx); err != nil {
		return nil, fmt.Errorf("redis %s: %w", ropt.Addr, err)
	}
	if a.Router, err = router.New(a.Store, a.Store, cfg.Router, router.Options{Logger: a.log}); err != nil {
		return nil, err
	}
	if cfg.ReplicasFile != "" {
		reps, err := LoadReplicasFile(cfg.ReplicasFile)
		if err != nil {
			return nil, err
		}
		for _, r := range reps {
			if err := a.Store.PutReplica(ctx, r); err != nil {
				return nil, fmt.Errorf("replicas file: %s: %w", r.ID, err)
			}
		}
		a.log.Info("registered replicas from file", "file", cfg.ReplicasFile, "count", len(reps))
	}

	a.Registry = prometheus.NewRegistry()
	a.Registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	a.API, err = api.New(api.Config{
		Router:       a.Router,
		Registry:     a.Store,
		Ready:        a.Store.Ping,
		Logger:       a.log,
		MaxBodyBytes: cfg.MaxBodyBytes,
		MaxTokens:    cfg.MaxTokens,
		Timeout:      cfg.RequestTimeout,
		Registerer:   a.Registry,
		Gatherer:     a.Registry,
	})
	if err != nil {
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

// Start listens and serves in the background, and starts the tasks.
func (a *App) Start() error {
	ln, err := net.Listen("tcp", a.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	a.ln = ln
	ctx, cancel := context.WithCancel(context.Background())
	a.cancel = cancel
	if a.mini != nil {
		a.goTick(ctx)
	}
	for _, t := range a.cfg.Tasks {
		a.wg.Go(func() {
			if err := t(ctx, a); err != nil && ctx.Err() == nil {
				a.log.Error("background task failed", "err", err)
			}
		})
	}
	a.served = make(chan error, 1)
	go func() { a.served <- a.srv.Serve(ln) }()
	a.log.Info("serving", "addr", ln.Addr().String(), "policy", a.cfg.Router.Scoring.Policy, "block_size", a.cfg.Router.BlockSize)
	return nil
}

// goTick advances the embedded Redis's clock: miniredis only expires keys
// (approximate entries) when told that time has passed.
func (a *App) goTick(ctx context.Context) {
	a.wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-ctx.Done():
				return
			case now := <-t.C:
				a.mini.FastForward(now.Sub(last))
				last = now
			}
		}
	})
}

// Addr is the address the server listens on, once started.
func (a *App) Addr() string {
	if a.ln == nil {
		return ""
	}
	return a.ln.Addr().String()
}

// Served reports the server's exit: an error if it stopped on its own.
func (a *App) Served() <-chan error { return a.served }

// Stop drains in-flight requests for up to ShutdownTimeout, stops the
// tasks and closes the store. It is safe to call on an App never started.
func (a *App) Stop() error {
	var err error
	if a.ln != nil {
		ctx, cancel := context.WithTimeout(context.Background(), a.cfg.ShutdownTimeout)
		err = a.srv.Shutdown(ctx)
		cancel()
		if err != nil {
			err = errors.Join(fmt.Errorf("shutdown: %w", err), a.srv.Close())
		}
	}
	if a.cancel != nil {
		a.cancel()
	}
	a.wg.Wait()
	a.closeStore()
	return err
}

func (a *App) closeStore() {
	if a.Store != nil {
		_ = a.Store.Close()
	}
	if a.mini != nil {
		a.mini.Close()
	}
}

// Run serves until ctx is done (or the server fails), then stops.
func Run(ctx context.Context, cfg Config) error {
	a, err := New(ctx, cfg)
	if err != nil {
		return err
	}
	if err := a.Start(); err != nil {
		_ = a.Stop()
		return err
	}
	var served error
	select {
	case <-ctx.Done():
		a.log.Info("shutting down", "timeout", a.cfg.ShutdownTimeout)
	case served = <-a.served:
	}
	stopErr := a.Stop()
	if served != nil && !errors.Is(served, http.ErrServerClosed) {
		return errors.Join(fmt.Errorf("serve: %w", served), stopErr)
	}
	return stopErr
}

// redisOptions parses a Redis URL for a scoring pod. Decisions sit on the
// request path, so unless the URL says otherwise a dead server is noticed
// in milliseconds (go-redis's own defaults are a 5 s dial, 3 s reads,
// 3 command retries and 5 dial retries: about 2 s per decision) and the
// router falls back to degraded mode.
func redisOptions(raw string) (*redis.Options, error) {
	o, err := redis.ParseURL(raw)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	q := u.Query()
	if !q.Has("dial_timeout") {
		o.DialTimeout = 300 * time.Millisecond
	}
	if !q.Has("read_timeout") {
		o.ReadTimeout = 500 * time.Millisecond
	}
	if !q.Has("write_timeout") {
		o.WriteTimeout = 500 * time.Millisecond
	}
	if !q.Has("max_retries") {
		// One retry rescues a pooled connection a Redis restart killed;
		// more only delay the fall-back.
		o.MaxRetries = 1
	}
	if !q.Has("max_retry_backoff") {
		o.MaxRetryBackoff = 20 * time.Millisecond
	}
	// go-redis also retries a refused dial five times 100 ms apart, on
	// every command: 0.8 s per decision during an outage.
	o.DialerRetries = 1
	o.DialerRetryTimeout = 10 * time.Millisecond
	return o, nil
}

// LoadReplicasFile reads a JSON array of replicas and validates each, so
// that a typo fails the start instead of leaving a replica unroutable.
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
