// Package ingestor keeps kvroute's Redis index in step with what every vLLM
// replica's KV cache holds. Per replica it subscribes to the engine's
// ZeroMQ event stream, checks sequence numbers (replaying gaps, rebuilding
// after restarts), decodes its msgpack batches (package kvevents, which
// knows every vLLM layout), translates them into index operations keyed the
// way requests are keyed, and applies each batch as one atomic store call.
// It also probes health, scrapes load metrics and sweeps expired load
// leases.
//
// Replicas are shared out between ingestors by ownership leases in the
// store, so any number of ingestors may run; a crashed one's replicas are
// taken over within the lease TTL, and re-applying a batch is a no-op.
package ingestor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/dialer"
	"github.com/kvroute/kvroute/ingestor/kvevents"
	"go.opentelemetry.io/otel/metric"
)

// Store is everything the ingestor needs from the state store; *store.Store
// satisfies it.
type Store interface {
	IndexStore
	// ListReplicas returns the registry, which decides what the ingestors
	// follow.
	ListReplicas(ctx context.Context) ([]kvroute.Replica, error)
	// RegistryVersion changes with every registry change, so that an
	// ingestor re-reads the registry only when it moved.
	RegistryVersion(ctx context.Context) (int64, error)
	// Epoch is the store's epoch, which changes only when the store lost
	// its data: every follower then rebuilds its replica from the replay
	// buffer at once, rather than at its stream's next batch, which a
	// quiet replica may not send for minutes.
	Epoch(ctx context.Context) (string, error)
	// ModelEpoch is the epoch of one model's keys, which under Redis
	// Cluster live on a shard that can lose its data alone: its
	// followers then rebuild at once, as after a change of Epoch.
	ModelEpoch(ctx context.Context, model string) (string, error)
	// Acquire takes or renews the ownership lease name for owner, true
	// while owner holds it: replicas are shared out between ingestors
	// this way, one follower each.
	Acquire(ctx context.Context, name, owner string, ttl time.Duration) (bool, error)
	// ReleaseOwnership gives up owner's lease on name (at shutdown, or a
	// replica gone from the registry) so that another ingestor can take it
	// at once instead of after its ttl; another owner's lease is left.
	ReleaseOwnership(ctx context.Context, name, owner string) error
	// SetHealth records a probe's outcome, which decisions exclude
	// unhealthy replicas by.
	SetHealth(ctx context.Context, id string, h kvroute.Health, at time.Time) error
	// SetScraped records the engine's own load from its /metrics, which
	// corrects the booked load for clients that bypass the router.
	SetScraped(ctx context.Context, model, replica string, waiting, running int64, kvUsage float64) error
	// SetBlockSize records the block size the replica reports, which the
	// router keys the model's requests with.
	SetBlockSize(ctx context.Context, id string, size int) error
	// SetDataParallelSize records how many data-parallel engines the
	// replica's metrics label, when nobody declared it, so that every
	// process follows, loads and routes them apart.
	SetDataParallelSize(ctx context.Context, id string, n int) error
	// SetFollowed records when the replica's stream was caught up (zero:
	// nobody follows it), which tells decisions its index is complete.
	SetFollowed(ctx context.Context, id string, since time.Time) error
	// ClaimReplica makes owner the only writer the store accepts for the
	// replica's index, so that an ingestor that lost the replica's lease
	// without noticing yet cannot interleave its writes (a reset above
	// all) with the new owner's (see store.Store.ClaimReplica).
	ClaimReplica(ctx context.Context, model, replica, owner string) error
	// SweepExpired releases the model's expired leases (bookings of pods
	// that died mid-request) and reports how many.
	SweepExpired(ctx context.Context, model string) (int, error)
	// PurgeReplica removes everything kept about a replica gone past its
	// grace period: index, load and leases.
	PurgeReplica(ctx context.Context, model, replica string) error
}

// Config configures an Ingestor. Only Store and Owner are required; every
// other field has a default, given in its comment, that suits production.
type Config struct {
	// Store is the state store the index, loads, leases and registry live
	// in. Required.
	Store Store
	// Owner names this ingestor in ownership leases, so that it must be
	// unique per process: two ingestors with one name would both believe
	// they hold a replica. Required.
	Owner string
	// LeaseTTL bounds how long a crashed ingestor's replicas go unfollowed;
	// leases are renewed every third of it. Zero means 15s.
	LeaseTTL time.Duration
	// RegistryInterval is how often the registry version and the store's
	// epoch are polled, which bounds how long a new replica waits to be
	// followed (a poll is one HGET and the epoch's SETNX and GET; a
	// changed version lists the registry and acquires the new replicas at
	// once) and how long the index stays empty after the store lost its
	// data. Zero means 500 ms.
	RegistryInterval time.Duration
	// HealthInterval is how often owned replicas' /health is probed, which
	// bounds how long a dead replica keeps receiving requests. Zero means
	// 5s.
	HealthInterval time.Duration
	// MetricsInterval is how often owned replicas' /metrics is scraped for
	// the load that bypassed the router. Zero means 5s.
	MetricsInterval time.Duration
	// SweepInterval is how often expired load leases are released, which
	// bounds how long a crashed pod's bookings outlive it. Zero means 5s.
	SweepInterval time.Duration
	// PurgeGrace is how long a replica must stay unhealthy before its
	// index entries are purged, so that a blip does not throw its cache
	// away. Zero means 2m.
	PurgeGrace time.Duration
	// StallTimeout is how long an event stream may stay silent before it
	// is flagged and redialled: a silent SUB may be connected to a dead
	// peer. Zero means 30s.
	StallTimeout time.Duration
	// ReplayTimeout bounds the wait for each replay reply, since a replica
	// answers a bad request with silence. Zero means 3s.
	ReplayTimeout time.Duration
	// MinBackoff and MaxBackoff bound the jittered redial delays, so that a
	// dead replica costs little and one that comes back is found soon.
	// Zero means 100ms and 10s.
	MinBackoff, MaxBackoff time.Duration
	// Bind, when set, is the one endpoint (e.g. "tcp://*:5557") where this
	// ingestor binds a SUB socket for replicas to connect their PUB to;
	// the topic then names the replica (Replica.Topic, or its ID). Empty
	// means the ingestor dials each replica's Events endpoint.
	Bind string
	// Seed is the key-space seed. It must equal the API's, or no event's
	// keys would match a request's; zero is what kvroute's commands use
	// unless told otherwise.
	Seed uint64
	// Logger receives operational logs. A nil Logger discards
	// (slog.New(slog.DiscardHandler)), so that a library user opts in.
	Logger *slog.Logger
	// Now is the clock of leases, purge grace and event lag, so that tests
	// can drive them. Nil means time.Now.
	Now func() time.Time
	// Rand jitters redial delays, so that ingestors redialling a replica
	// that came back do not arrive in lockstep; tests inject a seeded one.
	// Nil means a generator seeded from the runtime's random source.
	Rand *rand.Rand
	// Dialer makes every connection to a replica (probes, scrapes, the
	// ZeroMQ dials) under the replica address policy, so that a replica
	// whose name resolves to a metadata service is never reached. Nil
	// means dialer.New(kvroute.AddressPolicy{}, Logger): the default
	// policy.
	Dialer *dialer.Dialer
	// HTTPClient probes /health and scrapes /metrics. Nil means a client
	// with a 5s timeout connecting through Dialer; every request is also
	// bounded by its interval. A client given here dials as it likes.
	HTTPClient *http.Client
	// Transport opens the ZeroMQ sockets, so that tests can substitute
	// fakes. Nil means ZMQ{Dialer: Dialer}.
	Transport Transport
	// MeterProvider receives the ingestor's metrics (metrics.go). Nil
	// means a no-op provider: nothing is recorded.
	MeterProvider metric.MeterProvider
}

// Ingestor follows every replica in the registry that it owns.
type Ingestor struct {
	c   Config
	st  Store
	m   *Metrics
	log *slog.Logger
	rnd *lockedRand
	dsp *dispatcher

	mu       sync.Mutex
	replicas map[string]kvroute.Replica // the registry as last read
	owned    map[string]*owned          // replicas whose lease we hold
	version  int64
	read     bool   // the registry was read at least once
	epoch    string // the store's epoch as last read, empty before
	// modelEpochs are the followed models' epochs as last read.
	modelEpochs map[string]string
	// graceUntil is resetGrace after the store was last found to have lost
	// its data; kept holds the replicas followed on meanwhile that the
	// registry does not list; settled says every followed replica was
	// rebuilt and is listed as followed again.
	graceUntil time.Time
	kept       map[string]bool
	settled    bool
}

// owned is one replica this ingestor holds the lease of.
type owned struct {
	rep      kvroute.Replica
	renewed  time.Time
	w        *worker // nil for a replica without events
	cancel   context.CancelFunc
	done     chan struct{}
	badSince time.Time // start of continuous unhealth, zero if healthy
	purged   bool
}

// New validates c and returns an Ingestor; Run starts it.
func New(c Config) (*Ingestor, error) {
	if c.Store == nil {
		return nil, errors.New("ingestor: store is required")
	}
	if c.Owner == "" {
		return nil, errors.New("ingestor: owner is required")
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.LeaseTTL, 15*time.Second)
	def(&c.RegistryInterval, 500*time.Millisecond)
	def(&c.HealthInterval, 5*time.Second)
	def(&c.MetricsInterval, 5*time.Second)
	def(&c.SweepInterval, 5*time.Second)
	def(&c.PurgeGrace, 2*time.Minute)
	def(&c.StallTimeout, 30*time.Second)
	def(&c.ReplayTimeout, 3*time.Second)
	def(&c.MinBackoff, 100*time.Millisecond)
	def(&c.MaxBackoff, 10*time.Second)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Rand == nil {
		c.Rand = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	if c.Dialer == nil {
		c.Dialer = dialer.New(kvroute.AddressPolicy{}, c.Logger)
	}
	if c.HTTPClient == nil {
		c.HTTPClient = &http.Client{Timeout: 5 * time.Second, Transport: c.Dialer.Transport()}
	}
	if c.Transport == nil {
		c.Transport = ZMQ{Dialer: c.Dialer}
	}
	m, err := NewMetrics(c.MeterProvider)
	if err != nil {
		return nil, fmt.Errorf("ingestor: metrics: %w", err)
	}
	in := &Ingestor{
		c:        c,
		st:       c.Store,
		m:        m,
		log:      c.Logger.With("owner", c.Owner),
		rnd:      &lockedRand{r: c.Rand},
		replicas: map[string]kvroute.Replica{},
		owned:    map[string]*owned{},
	}
	in.dsp = &dispatcher{workers: map[string]*worker{}, m: m, log: in.log}
	return in, nil
}

// Run follows replicas until ctx is done, then stops every subscriber and
// releases its leases so that another ingestor takes over at once.
func (in *Ingestor) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	if in.c.Bind != "" {
		s, err := in.c.Transport.Listen(ctx, in.c.Bind)
		if err != nil {
			return fmt.Errorf("ingestor: %w", err)
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := in.dsp.run(ctx, s); err != nil {
				in.log.Error("bind socket", "err", err)
			}
		}()
	}
	loops := []struct {
		every time.Duration
		fn    func(context.Context)
	}{
		{in.c.LeaseTTL / 3, in.renewLeases},
		{in.c.HealthInterval, in.probeHealth},
		{in.c.MetricsInterval, in.scrapeMetrics},
		{in.c.SweepInterval, in.sweep},
	}
	in.poll(ctx)
	in.renewLeases(ctx)
	wg.Go(func() { in.pollLoop(ctx) })
	for _, l := range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.NewTicker(l.every)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return
				case <-t.C:
					l.fn(ctx)
				}
			}
		}()
	}
	<-ctx.Done()
	wg.Wait()
	in.shutdown()
	return nil
}

// shutdown stops every worker and releases its lease with a fresh context:
// the caller's is already done.
func (in *Ingestor) shutdown() {
	in.mu.Lock()
	os := make([]*owned, 0, len(in.owned))
	for id, o := range in.owned {
		os = append(os, o)
		delete(in.owned, id)
	}
	in.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, o := range os {
		in.stopWorker(o, true)
		if err := in.st.ReleaseOwnership(ctx, leaseName(o.rep.ID), in.c.Owner); err != nil {
			in.log.Warn("release lease", "replica", o.rep.ID, "err", err)
		}
	}
	in.m.owned.Set(0)
}

func leaseName(id string) string { return "ingest:" + id }

// Owned returns the ids of the replicas this ingestor follows now.
func (in *Ingestor) Owned() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	ids := make([]string, 0, len(in.owned))
	for id := range in.owned {
		ids = append(ids, id)
	}
	return ids
}

// renewLeases acquires or renews the lease of every registered replica.
// Each ingestor tries for every replica; the store grants each lease to one
// owner, so replicas spread across ingestors in the order they ask. A
// replica whose lease we could not renew for a whole TTL is given up: by
// then someone else may follow it.
func (in *Ingestor) renewLeases(ctx context.Context) {
	in.mu.Lock()
	reps := make([]kvroute.Replica, 0, len(in.replicas))
	for _, r := range in.replicas {
		reps = append(reps, r)
	}
	in.mu.Unlock()
	now := in.c.Now()
	for _, r := range reps {
		ok, err := in.st.Acquire(ctx, leaseName(r.ID), in.c.Owner, in.c.LeaseTTL)
		in.mu.Lock()
		o := in.owned[r.ID]
		in.mu.Unlock()
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return
			}
			in.log.Warn("acquire lease", "replica", r.ID, "err", err)
			if o != nil && now.Sub(o.renewed) > in.c.LeaseTTL {
				in.drop(o, "lease expired", true)
			}
		case ok && o == nil:
			in.start(ctx, r, now)
		case ok:
			in.mu.Lock()
			o.renewed = now
			in.mu.Unlock()
		case o != nil:
			// Another ingestor holds the lease, and follows the
			// replica: it is not left unfollowed.
			in.drop(o, "lease lost", false)
		}
	}
	in.m.owned.Set(float64(len(in.Owned())))
}

// drop stops following o; unfollow also records that nobody follows it,
// which is wrong when another ingestor took it over.
func (in *Ingestor) drop(o *owned, why string, unfollow bool) {
	in.mu.Lock()
	id := o.rep.ID
	if in.owned[id] == o {
		delete(in.owned, id)
	}
	in.mu.Unlock()
	in.log.Info("giving up replica", "replica", id, "why", why)
	in.stopWorker(o, unfollow)
}

// fenced answers a worker whose writes the store refused: another ingestor
// claimed the replica. While this ingestor still holds the replica's lease
// (the other claimed it in a gap, when the store lost the lease key with
// its data), it claims the replica back and the worker resyncs from what
// the store holds; otherwise it gives the replica up to the lease's holder.
func (in *Ingestor) fenced(ctx context.Context, o *owned) {
	in.mu.Lock()
	r := o.rep
	in.mu.Unlock()
	ok, err := in.st.Acquire(ctx, leaseName(r.ID), in.c.Owner, in.c.LeaseTTL)
	if err == nil && ok {
		err = in.st.ClaimReplica(ctx, r.Model, r.ID, in.c.Owner)
		if err == nil {
			in.log.Warn("claimed a replica back from another ingestor: this one holds its lease", "replica", r.ID)
			o.w.reclaimed()
			return
		}
	}
	if ctx.Err() != nil {
		return
	}
	if err != nil {
		// Nothing is known for sure: the next lease round starts it
		// again if the lease is still this ingestor's.
		in.log.Warn("fenced replica", "replica", r.ID, "err", err)
	}
	in.drop(o, "another ingestor writes it", false)
	in.m.owned.Set(float64(len(in.Owned())))
}

// start begins following r. A replica without an events endpoint (in dial
// mode) is still owned: its health and load are probed.
func (in *Ingestor) start(ctx context.Context, r kvroute.Replica, now time.Time) {
	o := &owned{rep: r, renewed: now}
	if _, engine := r.Rank(); engine && in.c.Bind != "" {
		// One bound SUB tells publishers apart by topic, which a
		// server's engines share: their streams cannot be told apart.
		in.log.Warn("a data-parallel replica's engines need dial mode (no --bind): its events go to one engine", "replica", r.ID)
	}
	if r.Events != "" || in.c.Bind != "" {
		log := in.log.With("replica", r.ID)
		var replay ReplayFunc
		if r.Replay != "" {
			ep, timeout := r.Replay, in.c.ReplayTimeout
			replay = func(ctx context.Context, from uint64, fn func(kvevents.Batch) error) error {
				return in.c.Transport.Replay(ctx, ep, from, timeout, fn)
			}
		}
		// Claimed before the first write: from here the store refuses
		// the previous owner's, if it still writes. A claim that fails
		// is made by the first batch applied, unless another writer
		// holds the replica: then the follower is fenced (fenced).
		if err := in.st.ClaimReplica(ctx, r.Model, r.ID, in.c.Owner); err != nil && ctx.Err() == nil {
			log.Warn("claim replica", "err", err)
		}
		f := NewFollower(FollowerConfig{
			Replica: r, Store: in.st, Writer: in.c.Owner, Replay: replay, Seed: in.c.Seed,
			Metrics: in.m, Logger: in.log, Now: in.c.Now,
		})
		o.w = newWorker(workerConfig{
			rep: r, follower: f, transport: in.c.Transport, dial: in.c.Bind == "",
			stallTimeout: in.c.StallTimeout, minBackoff: in.c.MinBackoff, maxBackoff: in.c.MaxBackoff,
			rnd: in.rnd.Float64, m: in.m, log: log, now: in.c.Now,
			onSynced: func(ctx context.Context) {
				// Decisions say a replica's index is incomplete until
				// this is recorded. A replica missing from the registry
				// (a store that lost its data, not re-seeded yet) is
				// marked by a later poll (markFollowed).
				err := in.st.SetFollowed(ctx, kvroute.ServerID(r.ID), in.c.Now())
				switch {
				case err == nil || ctx.Err() != nil:
				case errors.Is(err, kvroute.ErrNotFound):
					log.Debug("record followed", "err", err)
				default:
					log.Warn("record followed", "err", err)
				}
			},
			onFenced: func() { go in.fenced(ctx, o) },
		})
		wctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
		o.cancel, o.done = cancel, make(chan struct{})
		go func() { defer close(o.done); o.w.run(wctx) }()
		// Stop with the ingestor even if shutdown is never reached.
		context.AfterFunc(ctx, cancel)
		if in.c.Bind != "" {
			in.dsp.set(topicOf(r), o.w)
		}
	}
	in.mu.Lock()
	in.owned[r.ID] = o
	in.mu.Unlock()
	in.log.Info("following replica", "replica", r.ID, "events", r.Events)
}

// stopWorker stops o's worker; unfollow then records that nobody follows
// the replica, if the worker had caught up on it.
func (in *Ingestor) stopWorker(o *owned, unfollow bool) {
	if o.w == nil {
		return
	}
	if in.c.Bind != "" {
		in.dsp.set(topicOf(o.rep), nil)
	}
	o.cancel()
	<-o.done
	if unfollow && o.w.synced() {
		// Nobody follows it now (until another ingestor takes it over):
		// its index goes stale from here.
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := in.st.SetFollowed(ctx, kvroute.ServerID(o.rep.ID), time.Time{}); err != nil {
			in.log.Debug("record unfollowed", "replica", o.rep.ID, "err", err)
		}
	}
}

// ownedList snapshots the replicas this ingestor follows, for the probes
// and scrapes that run outside the lock.
func (in *Ingestor) ownedList() []ownedRep {
	in.mu.Lock()
	defer in.mu.Unlock()
	os := make([]ownedRep, 0, len(in.owned))
	for _, o := range in.owned {
		os = append(os, ownedRep{o, o.rep})
	}
	return os
}

// ownedRep is an owned replica with a copy of its registry entry taken under
// the lock: a registry reload rewrites o.rep while probes and scrapes run.
type ownedRep struct {
	*owned
	rep kvroute.Replica
}

// models lists the models of every registered replica.
func (in *Ingestor) models() []string {
	in.mu.Lock()
	defer in.mu.Unlock()
	seen := map[string]bool{}
	var ms []string
	for _, r := range in.replicas {
		if !seen[r.Model] {
			seen[r.Model] = true
			ms = append(ms, r.Model)
		}
	}
	return ms
}

// sweep releases expired load leases. Every ingestor may run it (the
// sweep is idempotent), but a short lease keeps it to one at a time.
func (in *Ingestor) sweep(ctx context.Context) {
	ok, err := in.st.Acquire(ctx, "sweeper", in.c.Owner, 3*in.c.SweepInterval)
	if err != nil || !ok {
		return
	}
	for _, m := range in.models() {
		n, err := in.st.SweepExpired(ctx, m)
		if err != nil {
			in.log.Warn("sweep", "model", m, "err", err)
			continue
		}
		in.m.swept.Add(float64(n))
	}
}
