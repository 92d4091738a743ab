package main

import (
	"errors"
	"flag"
	"strings"

	"github.com/kvroute/kvroute/store"
)

// redisFlags registers the Redis connection flags, shared by `kvroute
// serve` and `kvroute ingest` so that the two always reach Redis the same
// way, on fs; they fill c when fs is parsed (and applyEnv sets the
// KVROUTE_REDIS_* variables). urlUsage describes --redis-url, whose
// meaning when empty differs between the commands. Call checkRedisFlags
// after parsing.
func redisFlags(fs *flag.FlagSet, c *store.Config, urlUsage string) {
	fs.StringVar(&c.URL, "redis-url", "", urlUsage)
	fs.Var((*addrList)(&c.Addrs), "redis-addrs", "comma-separated `host:port` seeds: several mean a Redis Cluster, and with --redis-master they are Sentinels; they replace --redis-url's host (whose user, TLS and options still apply); or name them in --redis-url as go-redis does, redis://a:6379?addr=b:6379&addr=c:6379")
	fs.BoolVar(&c.Cluster, "redis-cluster", false, "use the Cluster client with a single seed (a managed cluster's configuration endpoint)")
	fs.StringVar(&c.MasterName, "redis-master", "", "Sentinel: the `name` of the primary the --redis-addrs Sentinels watch")
	fs.StringVar(&c.Username, "redis-username", "", "ACL `user` (overrides the URL's)")
	fs.StringVar(&c.Password, "redis-password", "", "ACL password (overrides the URL's; prefer the environment variable or --redis-password-file: flags show in ps)")
	fs.StringVar(&c.PasswordFile, "redis-password-file", "", "`file` holding the password (a mounted secret), read again on every new connection")
	fs.StringVar(&c.SentinelPassword, "redis-sentinel-password", "", "password of the Sentinels themselves, when they have one")
	fs.BoolVar(&c.TLS, "redis-tls", false, "connect with TLS (implied by rediss:// and by every --redis-tls-* file)")
	fs.StringVar(&c.TLSCAFile, "redis-tls-ca", "", "PEM `file` of the CA certificates the server's certificate must chain to (default: the system's)")
	fs.StringVar(&c.TLSCertFile, "redis-tls-cert", "", "PEM client certificate `file`, for servers that require one")
	fs.StringVar(&c.TLSKeyFile, "redis-tls-key", "", "PEM `file` of --redis-tls-cert's private key")
	fs.StringVar(&c.TLSServerName, "redis-tls-server-name", "", "`name` the server's certificate must carry, when not the host dialled (cluster nodes are dialled by IP)")
	fs.BoolVar(&c.ReadReplicas, "redis-read-replicas", false, "serve: send lookups' reads to replicas (a Cluster's or a Sentinel's), leaving the primary the bookings; a failed replica read goes to the primary (ingest ignores it)")
	fs.StringVar(&c.ReadURL, "redis-read-url", "", "serve: one server's replica or a managed Redis's reader endpoint (`redis://host:port`, rediss:// when --redis-url is) for lookups' reads; user, password, options and database default to --redis-url's (ingest ignores it)")
}

// checkRedisFlags rejects combinations that cannot work, naming the flags,
// before anything connects. Files are read when the store opens.
func checkRedisFlags(c store.Config) error {
	switch {
	case c.MasterName != "" && len(c.Addrs) == 0 && c.URL == "":
		return errors.New("--redis-master needs the Sentinels' addresses (--redis-addrs)")
	case c.MasterName != "" && c.Cluster:
		return errors.New("--redis-master (Sentinel) and --redis-cluster exclude each other")
	case c.Password != "" && c.PasswordFile != "":
		return errors.New("--redis-password and --redis-password-file: give one")
	case (c.TLSCertFile == "") != (c.TLSKeyFile == ""):
		return errors.New("--redis-tls-cert and --redis-tls-key go together")
	case c.ReadURL != "" && c.Topology() != "single":
		return errors.New("--redis-read-url is for one server: a Cluster or Sentinel finds its replicas (give --redis-read-replicas)")
	case c.ReadReplicas && c.Topology() == "single" && c.ReadURL == "":
		return errors.New("--redis-read-replicas on one server needs the replica's address (--redis-read-url)")
	case !c.Configured() && (c.ReadReplicas || c.ReadURL != "" || c.Cluster || c.MasterName != "" || c.Username != "" || c.Password != "" ||
		c.PasswordFile != "" || c.TLS || c.TLSCAFile != "" || c.TLSCertFile != "" || c.TLSServerName != ""):
		return errors.New("Redis settings given without --redis-url or --redis-addrs")
	}
	return nil
}

// addrList is --redis-addrs: comma-separated, and repeatable.
type addrList []string

func (a *addrList) String() string { return strings.Join(*a, ",") }

func (a *addrList) Set(v string) error {
	for _, s := range strings.Split(v, ",") {
		if s = strings.TrimSpace(s); s != "" {
			*a = append(*a, s)
		}
	}
	return nil
}
