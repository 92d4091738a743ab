package store

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Config says how every kvroute process reaches Redis: one server, a
// Sentinel-managed primary or a Cluster, chosen the way go-redis's
// universal client chooses (a master name means Sentinel, several seed
// addresses mean a Cluster, anything else one server). The zero Config
// names no Redis (see Configured).
type Config struct {
	// URL is a redis:// or rediss:// URL. It gives the scheme (rediss://
	// turns TLS on), user, password, database and client options in its
	// query (dial_timeout, read_timeout, write_timeout, max_retries,
	// pool_size, …, which override kvroute's request-path defaults). Its
	// host is the server, unless Addrs is set. go-redis's cluster form,
	// redis://host:port?addr=host2:port2&addr=host3:port3, names several
	// seeds, the host and each addr: a Cluster, as Addrs would (give the
	// seeds one way, not both).
	URL string
	// Addrs are host:port seeds that replace the URL's host: several mean
	// a Cluster; with MasterName they are the Sentinels.
	Addrs []string
	// Cluster selects the Cluster client with a single seed (a managed
	// cluster's configuration endpoint).
	Cluster bool
	// MasterName selects Sentinel: the seeds are Sentinels and this is
	// the name of the primary they watch.
	MasterName string
	// Username and Password are the ACL user and password; they override
	// the URL's. PasswordFile names a file holding the password instead
	// (a mounted secret): it is read at Open and again for every new
	// connection, so a rotated secret is picked up without a restart.
	Username     string
	Password     string
	PasswordFile string
	// SentinelUsername and SentinelPassword authenticate to the Sentinels
	// when they have their own ACL (Sentinel only).
	SentinelUsername string
	SentinelPassword string
	// TLS turns TLS on without a rediss:// URL; any TLS file implies it.
	// TLSCAFile holds the PEM CA certificates the server's certificate is
	// checked against (the system roots when empty); TLSCertFile and
	// TLSKeyFile are a client certificate for servers that require one
	// (tls-auth-clients); TLSServerName is the name the server's
	// certificate must carry when it is not the host dialled (cluster
	// nodes are dialled by the addresses they announce, often IPs).
	TLS           bool
	TLSCAFile     string
	TLSCertFile   string
	TLSKeyFile    string
	TLSServerName string
	// ReadReplicas sends a lookup's plain reads (the index probes and the
	// load fields: after the booking, most of a decision's Redis time) to
	// replicas, so that a hot model's primary spends its one thread on
	// bookings: a Cluster's replicas of the model's slot, or a Sentinel
	// primary's replicas. A replica lags its primary by the replication
	// delay (milliseconds), which a lookup tolerates: the booking reads the
	// loads again on the primary, and a stale index costs cache hits,
	// never a wrong booking. Registry, epoch and ingest reads stay on the
	// primary. A replica that fails a read sends reads back to the primary
	// for a while (see readBackoff).
	ReadReplicas bool
	// ReadURL is one server's replica, or a managed Redis's reader
	// endpoint, for ReadReplicas on a single server (it implies
	// ReadReplicas). The primary URL's user and password apply unless it
	// gives its own, and so do its query options, each unless it sets
	// that one, and its database unless it names one; Username, Password,
	// PasswordFile and the TLS files apply to both. A rediss:// primary
	// needs a rediss:// read URL.
	ReadURL string
}

// Configured reports whether c names a Redis at all; callers that have an
// embedded mode (kvroute serve) run it when not.
func (c Config) Configured() bool { return c.URL != "" || len(c.Addrs) > 0 }

// Topology names the client c selects: "single", "sentinel" or "cluster".
func (c Config) Topology() string {
	switch {
	case c.MasterName != "":
		return "sentinel"
	case len(c.Addrs) > 1 || c.Cluster || len(urlAddrs(c.URL)) > 0:
		return "cluster"
	}
	return "single"
}

// String describes c for logs: topology and seeds, never a secret.
func (c Config) String() string {
	seeds := c.Addrs
	if len(seeds) == 0 && c.URL != "" {
		if u, err := url.Parse(c.URL); err == nil {
			seeds = append([]string{u.Host}, urlAddrs(c.URL)...)
		}
	}
	s := c.Topology() + " " + strings.Join(seeds, ",")
	if c.MasterName != "" {
		s += " master " + c.MasterName
	}
	return s
}

// NewClient builds the Redis client c describes, with the client options
// of every kvroute process (see ClientOptions) whatever the topology: the
// one place a kvroute Redis client is made. It does not connect. From the
// first client on, go-redis's own log lines go to the structured log of
// the store opened last (redislog.go), not to stderr.
func NewClient(c Config) (redis.UniversalClient, error) {
	installRedisLog()
	uo, err := universalOptions(c)
	if err != nil {
		return nil, err
	}
	if c.Topology() == "cluster" {
		return instrument(newClusterClient(uo.Cluster())), nil
	}
	return instrument(redis.NewUniversalClient(uo)), nil
}

// NewReadClient builds the client c's lookup reads go to (ReadReplicas,
// ReadURL), or returns nil when they go to the primary. It is a client of
// its own, not the primary's: a Cluster client in ReadOnly mode sends
// every read-only command to replicas, and the registry must be read
// where it was written.
func NewReadClient(c Config) (redis.UniversalClient, error) {
	if !c.ReadReplicas && c.ReadURL == "" {
		return nil, nil
	}
	installRedisLog()
	switch topo := c.Topology(); {
	case c.ReadURL != "" && topo != "single":
		return nil, fmt.Errorf("redis read URL: a %s finds its replicas itself (give read replicas, not a read URL)", topo)
	case topo == "single" && c.ReadURL == "":
		return nil, errors.New("redis read replicas on one server: give the replica's URL (read URL)")
	case topo == "single":
		rc := c
		u, err := readURL(c.URL, c.ReadURL)
		if err != nil {
			return nil, err
		}
		rc.URL, rc.Addrs, rc.ReadURL, rc.ReadReplicas = u, nil, "", false
		return NewClient(rc)
	}
	uo, err := universalOptions(c)
	if err != nil {
		return nil, err
	}
	if c.Topology() == "sentinel" {
		fo := uo.Failover()
		fo.ReplicaOnly = true
		// After a failover the client keeps its connections to the
		// replica it read from, which may now be the primary: renewing
		// them moves the reads to a replica again.
		if fo.ConnMaxLifetime == 0 {
			fo.ConnMaxLifetime = readConnLifetime
		}
		return instrument(redis.NewFailoverClient(fo)), nil
	}
	co := uo.Cluster()
	co.ReadOnly = true
	// go-redis picks a replica per command, round robin by default: the
	// three reads of one lookup would come from replicas at different
	// replication offsets, and the slots read with the loads would not
	// be the index's. A fixed pick per process keeps a lookup on one
	// replica of its slot; pods pick apart. When the picked replica is
	// failing, go-redis sends this pod's reads to the primary (not to
	// another replica) until the replica recovers or leaves the slot map.
	co.ShardPicker = fixedPicker(rand.Uint32())
	return instrument(newClusterClient(co)), nil
}

// readConnLifetime bounds a Sentinel read client's connections.
const readConnLifetime = 30 * time.Second

// fixedPicker picks the same one of any number of replicas every time.
type fixedPicker uint32

func (p fixedPicker) Next(total int) int { return int(uint32(p) % uint32(max(total, 1))) }

// readURL is the read URL with the primary's user, password and query
// where it gives none.
func readURL(primary, read string) (string, error) {
	r, err := url.Parse(read)
	if err != nil || (r.Scheme != "redis" && r.Scheme != "rediss") || r.Host == "" {
		return "", fmt.Errorf("redis read url: want redis://host:port or rediss://host:port")
	}
	p, err := url.Parse(primary)
	if err != nil {
		return "", fmt.Errorf("redis url: %w", err)
	}
	if p.Scheme == "rediss" && r.Scheme != "rediss" {
		return "", fmt.Errorf("redis read url: the primary's URL is rediss://, so must the read URL be (the password would cross in clear)")
	}
	if r.User == nil {
		r.User = p.User
	}
	q := r.Query()
	ownDB := r.Path != "" && r.Path != "/"
	for k, v := range p.Query() {
		if !q.Has(k) && !(k == "db" && ownDB) {
			q[k] = v
		}
	}
	r.RawQuery = q.Encode()
	if r.Path == "" || r.Path == "/" {
		r.Path = p.Path
	}
	return r.String(), nil
}

// OpenConfig connects to the Redis c describes and checks that it answers,
// so that a bad address or password fails at startup rather than on the
// first request. go-redis's own log lines (one logger per process) go to
// opt.Logger from here on, rate-limited (redislog.go).
//
// A single server's URL that names one node of a Redis Cluster would
// work for the keys of that node's slots and answer MOVED for the rest,
// with the pod ready and the store reported up: the node is asked (INFO
// cluster) and, when it is one, the Cluster is followed from it as from a
// configuration endpoint (Config.Cluster), with a warning naming the
// flags that say so.
func OpenConfig(ctx context.Context, c Config, opt Options) (*Store, error) {
	s, err := openConfig(ctx, c, opt)
	if err != nil || c.Topology() != "single" || c.ReadURL != "" || !s.clusterNode(ctx) {
		return s, err
	}
	_ = s.Close()
	c.Cluster = true
	if opt.Logger != nil {
		opt.Logger.Warn("store: the Redis server named is a node of a Redis Cluster: following the Cluster from it; say so with --redis-cluster, or give every seed with --redis-addrs",
			"redis", c.String())
	}
	return openConfig(ctx, c, opt)
}

// clusterNode reports whether the server answers as a Cluster node. A
// server that refuses INFO (an ACL without it, the embedded server) is
// taken for what the configuration says.
func (s *Store) clusterNode(ctx context.Context) bool {
	info, err := s.c.Info(ctx, "cluster").Result()
	return err == nil && strings.Contains(info, "cluster_enabled:1")
}

func openConfig(ctx context.Context, c Config, opt Options) (*Store, error) {
	logRedisTo(opt.Logger, opt.Now)
	rc, err := NewClient(c)
	if err != nil {
		return nil, fmt.Errorf("store: open: %w", err)
	}
	reads := opt.Reads
	if reads == nil {
		if reads, err = NewReadClient(c); err != nil {
			_ = rc.Close()
			return nil, fmt.Errorf("store: open: %w", err)
		}
		opt.Reads = reads
	}
	s := New(rc, opt)
	if err := s.c.Ping(ctx).Err(); err != nil {
		_ = s.Close()
		return nil, wrap("open "+c.String(), err)
	}
	// A replica that does not answer yet is no reason to refuse to start:
	// reads fall back to the primary until it does.
	if reads != nil {
		pctx, cancel := context.WithTimeout(ctx, time.Second)
		if err := reads.Ping(pctx).Err(); err != nil {
			s.readFailed(err)
		}
		cancel()
	}
	return s, nil
}

func universalOptions(c Config) (*redis.UniversalOptions, error) {
	if !c.Configured() {
		return nil, errors.New("redis: no URL and no addresses")
	}
	extra := urlAddrs(c.URL)
	if len(extra) > 0 && len(c.Addrs) > 0 {
		return nil, errors.New("redis: seeds in both the URL (addr=) and the addresses: give them one way")
	}
	var o *redis.Options
	if c.URL != "" {
		var err error
		if o, err = ClientOptions(withoutAddrs(c.URL)); err != nil {
			return nil, err
		}
	} else {
		o = &redis.Options{}
		requestPathDefaults(o, nil)
	}
	addrs := append([]string{o.Addr}, extra...)
	if len(c.Addrs) > 0 {
		addrs = c.Addrs
	}
	if err := checkSeeds(c, o, addrs); err != nil {
		return nil, err
	}
	uo := universalFrom(c, o, addrs)
	if c.Username != "" {
		uo.Username = c.Username
	}
	if c.Password != "" {
		uo.Password = c.Password
	}
	if c.PasswordFile != "" {
		cred, err := passwordFile(c.PasswordFile, uo.Username)
		if err != nil {
			return nil, err
		}
		uo.Password = ""
		uo.CredentialsProviderContext = cred
	}
	tc, err := tlsConfig(c, o.TLSConfig)
	if err != nil {
		return nil, err
	}
	uo.TLSConfig = tc
	return uo, nil
}

// checkSeeds refuses a configuration go-redis would take and then fail
// on: a seed that is no host:port, a database under Cluster, two
// passwords, half a client certificate.
func checkSeeds(c Config, o *redis.Options, addrs []string) error {
	for _, a := range addrs {
		if a == "" || !strings.Contains(a, ":") {
			return fmt.Errorf("redis address %q: want host:port", a)
		}
	}
	if c.Topology() == "cluster" && o.DB != 0 {
		return fmt.Errorf("redis: database %d: a Cluster has only database 0", o.DB)
	}
	if c.Password != "" && c.PasswordFile != "" {
		return errors.New("redis: a password and a password file: give one")
	}
	if (c.TLSCertFile == "") != (c.TLSKeyFile == "") {
		return errors.New("redis: a TLS client certificate needs both its certificate and its key file")
	}
	return nil
}

// universalFrom carries the URL's options (o) over to the client for
// addrs, with c's topology.
func universalFrom(c Config, o *redis.Options, addrs []string) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:      addrs,
		ClientName: o.ClientName,
		DB:         o.DB,
		Protocol:   o.Protocol,
		Username:   o.Username,
		Password:   o.Password,

		SentinelUsername: c.SentinelUsername,
		SentinelPassword: c.SentinelPassword,

		MaxRetries:         o.MaxRetries,
		MinRetryBackoff:    o.MinRetryBackoff,
		MaxRetryBackoff:    o.MaxRetryBackoff,
		DialTimeout:        o.DialTimeout,
		DialerRetries:      o.DialerRetries,
		DialerRetryTimeout: o.DialerRetryTimeout,
		ReadTimeout:        o.ReadTimeout,
		WriteTimeout:       o.WriteTimeout,
		// The caller's deadline bounds every command (a decision's
		// budget is the request's), not only the socket timeouts.
		ContextTimeoutEnabled: true,

		PoolFIFO:        o.PoolFIFO,
		PoolSize:        o.PoolSize,
		PoolTimeout:     o.PoolTimeout,
		MinIdleConns:    o.MinIdleConns,
		MaxIdleConns:    o.MaxIdleConns,
		MaxActiveConns:  o.MaxActiveConns,
		ConnMaxIdleTime: o.ConnMaxIdleTime,
		ConnMaxLifetime: o.ConnMaxLifetime,

		MasterName:    c.MasterName,
		IsClusterMode: c.Cluster,
	}
}

// urlAddrs are the seeds a go-redis cluster URL adds to its host, its
// addr options; nil for any other URL (a malformed one is ClientOptions'
// to refuse).
func urlAddrs(rawURL string) []string {
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil
	}
	return u.Query()["addr"]
}

// withoutAddrs is rawURL without its addr options, which redis.ParseURL
// (one server's options) refuses.
func withoutAddrs(rawURL string) string {
	u, err := url.Parse(rawURL)
	if err != nil || !u.Query().Has("addr") {
		return rawURL
	}
	q := u.Query()
	q.Del("addr")
	u.RawQuery = q.Encode()
	return u.String()
}

// passwordFile reads the password in path now (so that a missing secret
// fails at startup) and returns a credentials provider that reads it again
// for every new connection, keeping the last good value when the file is
// briefly absent (a secret being swapped).
func passwordFile(path, user string) (func(context.Context) (string, string, error), error) {
	read := func() (string, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("redis password file: %w", err)
		}
		return strings.TrimRight(string(b), "\r\n"), nil
	}
	pw, err := read()
	if err != nil {
		return nil, err
	}
	var mu sync.Mutex
	return func(context.Context) (string, string, error) {
		mu.Lock()
		defer mu.Unlock()
		if p, err := read(); err == nil {
			pw = p
		}
		return user, pw, nil
	}, nil
}

// tlsConfig returns the TLS settings of c on top of the URL's (rediss://
// gives a config naming the URL's host), or nil for plain TCP.
func tlsConfig(c Config, fromURL *tls.Config) (*tls.Config, error) {
	on := fromURL != nil || c.TLS || c.TLSCAFile != "" || c.TLSCertFile != "" || c.TLSServerName != ""
	if !on {
		return nil, nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if fromURL != nil {
		tc = fromURL.Clone()
		if tc.MinVersion == 0 {
			tc.MinVersion = tls.VersionTLS12
		}
	}
	if c.TLSServerName != "" {
		tc.ServerName = c.TLSServerName
	}
	if c.TLSCAFile != "" {
		pem, err := os.ReadFile(c.TLSCAFile)
		if err != nil {
			return nil, fmt.Errorf("redis TLS CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("redis TLS CA %s: no PEM certificate", c.TLSCAFile)
		}
		tc.RootCAs = pool
	}
	if c.TLSCertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.TLSCertFile, c.TLSKeyFile)
		if err != nil {
			return nil, fmt.Errorf("redis TLS client certificate: %w", err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return tc, nil
}

// ClientOptions parses a Redis URL into the client options of every
// kvroute process, scoring pods and ingestors alike, so that the two never
// run with different timeouts. Decisions sit on the request path, so
// unless the URL says otherwise a dead server is noticed in milliseconds
// (go-redis's own defaults are a 5 s dial, 3 s reads, 3 command retries and
// 5 dial retries: about 2 s per decision) and the router falls back to
// degraded mode. The URL's own query parameters (dial_timeout,
// read_timeout, write_timeout, max_retries, max_retry_backoff, pool_size,
// …) win. NewClient applies the same options to every topology.
func ClientOptions(rawURL string) (*redis.Options, error) {
	o, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	requestPathDefaults(o, u.Query())
	o.ContextTimeoutEnabled = true
	return o, nil
}

// requestPathDefaults sets kvroute's client defaults on o where q (a URL's
// query; nil: none) does not set them.
func requestPathDefaults(o *redis.Options, q url.Values) {
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
}
