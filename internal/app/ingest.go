package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/oklog/run"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/dialer"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/internal/telemetry"
	"github.com/kvroute/kvroute/store"
)

// IngestConfig is everything `kvroute ingest` is configured with.
type IngestConfig struct {
	// RedisURL is the shared index; required (an ingestor alone over an
	// embedded Redis would write an index nobody reads).
	RedisURL string
	// Redis is the full store setting (Sentinel, Cluster, ACL user,
	// password file, TLS files); when configured it wins over RedisURL.
	Redis store.Config
	// MetricsListen is the address of /metrics and /healthz; port 0 picks
	// a free port.
	MetricsListen string
	// Ingestor is the ingestor's configuration; its Store, MeterProvider
	// and (when nil) Logger and Dialer are filled here.
	Ingestor ingestor.Config
	// ReplicaPolicy says which addresses the ingestor may connect to
	// (probes, scrapes, ZeroMQ), as serve's does; the zero value is the
	// default policy. It builds the Dialer when Ingestor.Dialer is nil.
	ReplicaPolicy kvroute.AddressPolicy
	// Discover, when it has sources, runs discovery in this ingestor:
	// the fleet it finds is written into the registry it follows (one
	// discoverer a source at a time, by lease, however many ingestors
	// run with the same flags).
	Discover DiscoverConfig
	// Logger receives every component's logs; nil discards them.
	Logger *slog.Logger
	// Listening, when not nil, is told the metrics server's address once
	// it listens (tests use it to find a port-0 server).
	Listening func(addr string)
}

// RunIngest is `kvroute ingest`: the store, the ingestor and its metrics
// server in one run group. It returns when ctx is done (nil) or when a
// component fails (its error): an ingestor whose metrics server cannot
// serve, or whose event loop died, must not linger as if it worked.
func RunIngest(ctx context.Context, c IngestConfig) error {
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	log = slog.New(telemetry.LogHandler(log.Handler()))
	st, err := openIngestStore(ctx, c, log)
	if err != nil {
		return err
	}
	defer st.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	mp, err := ingestTelemetry(st, reg)
	if err != nil {
		return err
	}
	ic := c.Ingestor
	ic.Store, ic.MeterProvider = st, mp
	if ic.Logger == nil {
		ic.Logger = log
	}
	if ic.Dialer == nil {
		ic.Dialer = dialer.New(c.ReplicaPolicy, log.With("component", "dialer"))
	}
	in, err := ingestor.New(ic)
	if err != nil {
		return err
	}

	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, `{"status":"ok"}`) })
	ln, err := net.Listen("tcp", c.MetricsListen)
	if err != nil {
		return fmt.Errorf("metrics listen: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	if c.Listening != nil {
		c.Listening(ln.Addr().String())
	}

	var g run.Group
	{
		ctx, cancel := context.WithCancel(ctx)
		g.Add(func() error {
			<-ctx.Done()
			return nil
		}, func(error) { cancel() })
	}
	addUntilDone(ctx, &g, "ingestor", in.Run)
	if c.Discover.Enabled() {
		dc := c.Discover
		if dc.Owner == "" {
			dc.Owner = ic.Owner
		}
		addUntilDone(ctx, &g, "discovery", func(ctx context.Context) error {
			return runDiscovery(ctx, dc, st, ic.Dialer, c.ReplicaPolicy, mp, log)
		})
	}
	g.Add(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("metrics server: %w", err)
		}
		return nil
	}, func(error) {
		sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	})
	log.Info("ingesting", "owner", ic.Owner, "metrics", ln.Addr().String(), "bind", ic.Bind)
	return g.Run()
}

// openIngestStore opens the store an ingestor writes. An ingestor makes no
// lookups: the read-replica settings it shares with serve would only open
// a client it never uses, so they are dropped.
func openIngestStore(ctx context.Context, c IngestConfig, log *slog.Logger) (*store.Store, error) {
	rc := c.Redis
	if !rc.Configured() && c.RedisURL != "" {
		rc = store.Config{URL: c.RedisURL}
	}
	if !rc.Configured() {
		return nil, errors.New("ingest: a Redis URL is required: an ingestor writes the shared index")
	}
	rc.ReadReplicas, rc.ReadURL = false, ""
	return store.OpenConfig(ctx, rc, store.Options{Logger: log})
}

// addUntilDone adds to g a component that must run until ctx ends: its
// returning earlier, with an error or without, stops the process with
// that reason, named.
func addUntilDone(ctx context.Context, g *run.Group, name string, fn func(context.Context) error) {
	ctx, cancel := context.WithCancel(ctx)
	g.Add(func() error {
		err := fn(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if err == nil {
			err = errors.New("ended")
		}
		return fmt.Errorf("%s: %w", name, err)
	}, func(error) { cancel() })
}
