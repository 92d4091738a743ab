package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/store"
)

// ingestConfig is everything `kvroute ingest` is configured with.
type ingestConfig struct {
	redis         store.Config
	metricsListen string
	ing           ingestor.Config
	allowCIDRs    prefixList
	log           logConfig
	discover      discoverFlags
}

func parseIngest(args []string, getenv func(string) string, stderr io.Writer) (ingestConfig, error) {
	fs := flag.NewFlagSet("ingest", flag.ContinueOnError)
	fs.SetOutput(stderr)
	host, _ := os.Hostname()
	c := ingestConfig{}
	redisFlags(fs, &c.redis, "Redis `URL` holding the index (this or --redis-addrs is required: ingestors share the fleet through it)")
	fs.StringVar(&c.metricsListen, "metrics-listen", ":9091", "`address` serving /metrics and /healthz")
	fs.StringVar(&c.ing.Owner, "owner", fmt.Sprintf("%s-%d", host, os.Getpid()), "this ingestor's `name` in ownership leases; unique per process")
	fs.StringVar(&c.ing.Bind, "bind", "", "bind one SUB `endpoint` (e.g. tcp://*:5557) for replicas to connect to, instead of dialing each replica")
	fs.Uint64Var(&c.ing.Seed, "seed", 0, "block-key seed; must equal every serve pod's --seed")
	fs.DurationVar(&c.ing.LeaseTTL, "lease-ttl", 15*time.Second, "ownership lease: how long a crashed ingestor's replicas go unfollowed")
	fs.DurationVar(&c.ing.HealthInterval, "health-interval", 5*time.Second, "how often each replica's /health is probed")
	fs.DurationVar(&c.ing.MetricsInterval, "metrics-interval", 5*time.Second, "how often each replica's /metrics is scraped")
	fs.DurationVar(&c.ing.SweepInterval, "sweep-interval", 5*time.Second, "how often expired load leases are released")
	fs.DurationVar(&c.ing.PurgeGrace, "purge-grace", 2*time.Minute, "how long a replica stays unhealthy before its index entries are purged")
	fs.DurationVar(&c.ing.StallTimeout, "stall-timeout", 30*time.Second, "silence after which an event stream is flagged and redialled")
	fs.Var(&c.allowCIDRs, "allow-replica-cidrs", "comma-separated `prefixes` the ingestor may connect to although refused by default (link-local, metadata services); give serve's value")
	c.discover.register(fs)
	fs.StringVar(&c.log.level, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&c.log.format, "log-format", "text", "log `format`: text or json")
	fs.Usage = flagUsage(fs, stderr, "ingest", "Follows every registered replica's KV-cache events into Redis. Run several: they share the replicas by leases.\n")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if err := applyEnv(fs, getenv); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if !c.redis.Configured() {
		return c, errors.New("--redis-url or --redis-addrs (KVROUTE_REDIS_URL, KVROUTE_REDIS_ADDRS) is required: an ingestor writes the shared index; for a one-process trial run `kvroute serve` without it")
	}
	if err := checkRedisFlags(c.redis); err != nil {
		return c, err
	}
	return c, nil
}

// runIngest is `kvroute ingest`: the long-running process that writes the
// index. It only parses; internal/app wires the store, the ingestor and a
// metrics endpoint.
func runIngest(ctx context.Context, args []string, _, stderr io.Writer) error {
	c, err := parseIngest(args, os.Getenv, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	log, err := newLogger(stderr, c.log)
	if err != nil {
		return usageError{err}
	}
	dc, err := c.discover.config(log)
	if err != nil {
		return usageError{err}
	}
	return app.RunIngest(ctx, app.IngestConfig{Redis: c.redis, MetricsListen: c.metricsListen, Ingestor: c.ing, Logger: log,
		ReplicaPolicy: kvroute.AddressPolicy{Allow: c.allowCIDRs}, Discover: dc})
}
