package discovery

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel/metric"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/dialer"
)

// Registry is what discovery needs of the registry; *store.Store satisfies
// it. Every write is conditional on what is stored at that moment, so that
// a replica an operator registers under the same id in between is never
// overwritten or deleted.
type Registry interface {
	// ListReplicas returns the registry, which tells the reconciler what
	// its source wrote before (this process's or another's: the lease
	// moves between ingestors).
	ListReplicas(ctx context.Context) ([]kvroute.Replica, error)
	// EditReplica rewrites one replica atomically from the stored one.
	EditReplica(ctx context.Context, id string, edit func(r *kvroute.Replica, found bool) (bool, error)) error
	// DeleteReplicaIf deletes and purges one replica (index, load,
	// bookings) if del still approves of the stored one.
	DeleteReplicaIf(ctx context.Context, id string, del func(kvroute.Replica) bool) (bool, error)
	// ResetReplica forgets a replica's event-fed index entries and
	// applied seq: one that came back is a restarted cache. Discovery
	// is no index writer: it passes an empty writer, never fenced, and
	// the follower notices the reset by its seq.
	ResetReplica(ctx context.Context, model, replica, writer string) error
	// Acquire takes or renews the lease that makes one process at a time
	// the writer of a source's replicas.
	Acquire(ctx context.Context, name, owner string, ttl time.Duration) (bool, error)
	// ReleaseOwnership gives the lease up on exit, so that another
	// ingestor takes the source over at once rather than after its ttl.
	ReleaseOwnership(ctx context.Context, name, owner string) error
}

// Config configures a Reconciler. Registry, Sources and Owner are
// required; every other field has the default its comment gives.
type Config struct {
	// Registry is where discovered replicas are written. Required.
	Registry Registry
	// Sources are the fleets to follow, each under its own lease.
	// Required: at least one.
	Sources []Source
	// Owner names this process in the sources' leases; unique per
	// process, as the ingestor's owner is. Required.
	Owner string
	// Interval is how often the last reported set is reconciled again
	// even when the source reports no change: model lookups that failed
	// are retried, gone replicas past their grace are purged and the
	// lease is renewed. Zero means 5s.
	Interval time.Duration
	// Grace is how long a gone replica is kept (not routed, its index and
	// bookings intact) before it is purged; one that comes back within it
	// is still a new replica (its index reset). Zero means 30s.
	Grace time.Duration
	// LeaseTTL bounds how long a source goes unreconciled after its
	// discoverer died; it is renewed every pass and raised to three
	// Intervals when shorter. Zero means 15s.
	LeaseTTL time.Duration
	// ModelTimeout bounds one GET /v1/models. Zero means 2s.
	ModelTimeout time.Duration
	// HTTPClient asks endpoints for their models. Nil means a client
	// over Dialer with ModelTimeout.
	HTTPClient *http.Client
	// Dialer connects to endpoints under the replica address policy. Nil
	// means dialer.New(Policy, Logger).
	Dialer *dialer.Dialer
	// Policy is checked on every replica before it is written, as the
	// admin API checks a registration: a DNS answer must not point the
	// proxy at a metadata service. The zero value is the default policy.
	Policy kvroute.AddressPolicy
	// Now is the clock of states and grace periods. Nil means time.Now.
	Now func() time.Time
	// Logger receives what discovery did and what it skipped. Nil
	// discards.
	Logger *slog.Logger
	// MeterProvider makes discovery's metrics. Nil means a no-op one.
	MeterProvider metric.MeterProvider
}

// Reconciler writes what its sources report into the registry: an
// endpoint becomes a replica once its model is known, a terminating one is
// kept but not routed, a vanished one is gone at once and purged after
// Grace. It only ever touches replicas whose Source is one of its sources.
type Reconciler struct {
	c      Config
	log    *slog.Logger
	m      *metrics
	client *http.Client

	mu sync.Mutex
	// warned holds the "source\x00id" pairs already logged at Warn for a
	// condition that repeats every pass (a failing lookup, a foreign id),
	// so that it is logged once, not every interval.
	warned map[string]bool
}

// New checks c and builds a Reconciler.
func New(c Config) (*Reconciler, error) {
	switch {
	case c.Registry == nil:
		return nil, errors.New("discovery: a registry is required")
	case len(c.Sources) == 0:
		return nil, errors.New("discovery: no source")
	case c.Owner == "":
		return nil, errors.New("discovery: an owner is required")
	}
	names := map[string]bool{}
	for _, s := range c.Sources {
		if names[s.Name()] {
			return nil, fmt.Errorf("discovery: source %q given twice", s.Name())
		}
		names[s.Name()] = true
	}
	def := func(d *time.Duration, v time.Duration) {
		if *d <= 0 {
			*d = v
		}
	}
	def(&c.Interval, 5*time.Second)
	def(&c.Grace, 30*time.Second)
	def(&c.LeaseTTL, 15*time.Second)
	def(&c.ModelTimeout, 2*time.Second)
	c.LeaseTTL = max(c.LeaseTTL, 3*c.Interval)
	if c.Now == nil {
		c.Now = time.Now
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if c.Dialer == nil {
		c.Dialer = dialer.New(c.Policy, log)
	}
	client := c.HTTPClient
	if client == nil {
		client = &http.Client{Timeout: c.ModelTimeout, Transport: c.Dialer.Transport()}
	}
	m, err := newMetrics(c.MeterProvider)
	if err != nil {
		return nil, err
	}
	return &Reconciler{c: c, log: log.With("component", "discovery"), m: m, client: client, warned: map[string]bool{}}, nil
}

// Run follows every source until ctx ends (then nil) or a source fails
// for good (its error: a malformed configuration no retry mends).
func (r *Reconciler) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 2*len(r.c.Sources))
	for _, s := range r.c.Sources {
		r.m.zero(ctx, s.Name())
		f := &feed{changed: make(chan struct{}, 1)}
		go func() {
			err := s.Run(ctx, func(eps []Endpoint) { f.put(eps); r.m.endpoints.Record(ctx, int64(len(eps)), src(s.Name())) })
			if ctx.Err() == nil {
				if err == nil {
					err = errors.New("ended")
				}
				err = fmt.Errorf("discovery: source %s: %w", s.Name(), err)
			} else {
				err = nil
			}
			errs <- err
		}()
		go func() { errs <- r.follow(ctx, s.Name(), f) }()
	}
	var first error
	for range 2 * len(r.c.Sources) {
		if err := <-errs; err != nil && first == nil {
			first = err
			cancel()
		}
	}
	return first
}

// feed holds the last set a source reported, for its reconcile loop.
type feed struct {
	mu      sync.Mutex
	eps     []Endpoint
	have    bool
	changed chan struct{}
}

func (f *feed) put(eps []Endpoint) {
	f.mu.Lock()
	f.eps, f.have = append([]Endpoint(nil), eps...), true
	f.mu.Unlock()
	select {
	case f.changed <- struct{}{}:
	default:
	}
}

func (f *feed) get() ([]Endpoint, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.eps, f.have
}

// follow reconciles one source at every change and every Interval, while
// this process holds the source's lease; it gives the lease up on return
// so that another discoverer takes over at once.
func (r *Reconciler) follow(ctx context.Context, name string, f *feed) error {
	lease := "discovery:" + name
	defer func() {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		if err := r.c.Registry.ReleaseOwnership(rctx, lease, r.c.Owner); err != nil {
			r.log.Warn("release the source's lease", "source", name, "err", err)
		}
	}()
	t := time.NewTicker(r.c.Interval)
	defer t.Stop()
	held := false
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-f.changed:
		case <-t.C:
		}
		ok, err := r.c.Registry.Acquire(ctx, lease, r.c.Owner, r.c.LeaseTTL)
		if err != nil {
			if ctx.Err() == nil {
				r.log.Warn("discovery lease", "source", name, "err", err)
			}
			continue
		}
		if ok != held {
			held = ok
			r.log.Info("discovery lease", "source", name, "held", ok)
		}
		if eps, have := f.get(); ok && have {
			r.Reconcile(ctx, name, eps)
		}
	}
}

// Reconcile makes the registry's replicas of source name match eps, the
// complete set it reports now. Failures are logged and retried at the
// next pass; nothing is half-written (each replica is one atomic write).
// It is exported for tests that drive a pass without a source or lease.
func (r *Reconciler) Reconcile(ctx context.Context, name string, eps []Endpoint) {
	reps, err := r.c.Registry.ListReplicas(ctx)
	if err != nil {
		r.log.Warn("discovery: list replicas", "source", name, "err", err)
		return
	}
	now := r.c.Now()
	stored := make(map[string]kvroute.Replica, len(reps))
	for _, rep := range reps {
		stored[rep.ID] = rep
	}
	seen := make(map[string]bool, len(eps))
	for _, ep := range eps {
		id := ReplicaID(ep.Name)
		if seen[id] {
			r.m.skip(ctx, name, "duplicate")
			continue
		}
		seen[id] = true
		cur, found := stored[id]
		if found && cur.Source != name {
			r.foreign(ctx, name, id, cur.Source)
			continue
		}
		r.apply(ctx, name, id, ep, cur, found, now)
	}
	for _, cur := range reps {
		if cur.Source != name || seen[cur.ID] {
			continue
		}
		if cur.State != kvroute.StateGone {
			r.markGone(ctx, name, cur.ID, now)
		} else if now.Sub(cur.StateSince) >= r.c.Grace {
			r.purge(ctx, name, cur.ID, now)
		}
	}
}

// errForeign stops an edit of a replica that is not the source's own.
var errForeign = errors.New("the replica is not this source's")

// adaptersLabel lists the LoRA adapters an endpoint's /v1/models showed,
// comma-separated, for operators to read (routing keys by base model).
const adaptersLabel = "adapters"

// apply writes one reported endpoint: new, changed, returned from gone,
// or unchanged (no write, no registry version move).
func (r *Reconciler) apply(ctx context.Context, name, id string, ep Endpoint, cur kvroute.Replica, found bool, now time.Time) {
	want := kvroute.Replica{
		ID: id, Source: name, Model: ep.Model, Labels: maps.Clone(ep.Labels),
		URL:    "http://" + net.JoinHostPort(ep.Host, strconv.Itoa(ep.HTTPPort)),
		Events: zmqEndpoint(ep.Host, ep.EventsPort), Replay: zmqEndpoint(ep.Host, ep.ReplayPort),
	}
	if ep.Terminating {
		want.State = kvroute.StateTerminating
	}
	returning := found && cur.State == kvroute.StateGone
	if want.Model == "" {
		if found && !returning && cur.URL == want.URL && cur.Model != "" {
			want.Model = cur.Model
			if a, ok := cur.Labels[adaptersLabel]; ok {
				want.Labels = setLabel(want.Labels, adaptersLabel, a)
			}
		} else {
			lctx, cancel := context.WithTimeout(ctx, r.c.ModelTimeout)
			s, err := lookupModels(lctx, r.client, want.URL)
			cancel()
			if err != nil {
				r.m.lookups.Add(ctx, 1, src(name))
				r.warnOnce(name, id, "discovery: an endpoint's model is not known yet; it is not registered until it is", "url", want.URL, "err", err)
				return
			}
			r.clearWarned(name, id)
			want.Model = s.Model
			if a := strings.Join(s.Adapters, ","); a != "" && len(a) <= kvroute.MaxLabelValBytes {
				want.Labels = setLabel(want.Labels, adaptersLabel, a)
			}
		}
	}
	if err := r.c.Policy.Check(want); err != nil {
		r.m.skip(ctx, name, "refused")
		r.warnOnce(name, id, "discovery: the address policy refuses an endpoint", "url", want.URL, "err", err)
		return
	}
	if returning {
		// Back before its purge: a restarted engine, whose cache is empty
		// and whose event seq starts over. Reset before it is routable.
		for _, e := range cur.Engines() {
			if err := r.c.Registry.ResetReplica(ctx, cur.Model, e.ID, ""); err != nil {
				r.log.Warn("discovery: reset a returning replica", "source", name, "replica", e.ID, "err", err)
				return
			}
		}
	}
	err := r.c.Registry.EditReplica(ctx, id, func(rep *kvroute.Replica, ok bool) (bool, error) {
		if ok && rep.Source != name {
			return false, errForeign
		}
		fresh := !ok || rep.State == kvroute.StateGone
		if fresh {
			// What the ingestors learned of the old process no longer
			// holds: probe, follow and measure it again.
			*rep = kvroute.Replica{BlockSize: rep.BlockSize}
		}
		if fresh || rep.State != want.State {
			rep.State, rep.StateSince = want.State, now
		}
		rep.ID, rep.Source, rep.Model, rep.URL = id, name, want.Model, want.URL
		rep.Events, rep.Replay, rep.Labels = want.Events, want.Replay, want.Labels
		return true, nil
	})
	switch {
	case errors.Is(err, errForeign):
		r.foreign(ctx, name, id, "")
	case err != nil:
		r.log.Warn("discovery: write replica", "source", name, "replica", id, "err", err)
	case !found || returning:
		r.m.added.Add(ctx, 1, src(name))
		r.log.Info("discovered replica", "source", name, "replica", id, "model", want.Model, "url", want.URL, "returned", returning)
	}
}

// markGone takes a replica its source no longer reports out of routing at
// once; its index and bookings stay until the grace period ends.
func (r *Reconciler) markGone(ctx context.Context, name, id string, now time.Time) {
	err := r.c.Registry.EditReplica(ctx, id, func(rep *kvroute.Replica, ok bool) (bool, error) {
		if !ok || rep.Source != name || rep.State == kvroute.StateGone {
			return false, nil
		}
		rep.State, rep.StateSince = kvroute.StateGone, now
		return true, nil
	})
	if err != nil {
		r.log.Warn("discovery: mark replica gone", "source", name, "replica", id, "err", err)
		return
	}
	r.m.gone.Add(ctx, 1, src(name))
	r.log.Info("discovered replica gone", "source", name, "replica", id, "purged_in", r.c.Grace)
}

// purge deletes a replica gone for longer than the grace period, if it is
// still the source's and still gone: its index, load and bookings go with
// it.
func (r *Reconciler) purge(ctx context.Context, name, id string, now time.Time) {
	ok, err := r.c.Registry.DeleteReplicaIf(ctx, id, func(rep kvroute.Replica) bool {
		return rep.Source == name && rep.State == kvroute.StateGone && now.Sub(rep.StateSince) >= r.c.Grace
	})
	if err != nil {
		r.log.Warn("discovery: purge replica", "source", name, "replica", id, "err", err)
		return
	}
	if ok {
		r.m.purged.Add(ctx, 1, src(name))
		r.log.Info("purged gone replica", "source", name, "replica", id)
	}
}

// foreign counts and logs (once) an endpoint whose id is a replica some
// other writer owns: discovery never updates or deletes it.
func (r *Reconciler) foreign(ctx context.Context, name, id, owner string) {
	r.m.skip(ctx, name, "foreign")
	if owner == "" {
		owner = "registered"
	}
	r.warnOnce(name, id, "discovery: an endpoint's id is another writer's replica; left alone", "owner", owner)
}

func (r *Reconciler) warnOnce(name, id, msg string, args ...any) {
	k := name + "\x00" + id
	r.mu.Lock()
	first := !r.warned[k]
	r.warned[k] = true
	r.mu.Unlock()
	lvl := slog.LevelDebug
	if first {
		lvl = slog.LevelWarn
	}
	r.log.Log(context.Background(), lvl, msg, append([]any{"source", name, "replica", id}, args...)...)
}

func (r *Reconciler) clearWarned(name, id string) {
	r.mu.Lock()
	delete(r.warned, name+"\x00"+id)
	r.mu.Unlock()
}

func setLabel(m map[string]string, k, v string) map[string]string {
	if m == nil {
		m = map[string]string{}
	}
	m[k] = v
	return m
}

func zmqEndpoint(host string, port int) string {
	if port <= 0 {
		return ""
	}
	return "tcp://" + net.JoinHostPort(host, strconv.Itoa(port))
}

// ReplicaID derives a replica's ID from an endpoint's Name: the name
// itself when it is a valid ID, else its valid characters (others become
// '-'), cut to fit, and a hash of the whole name, so that distinct names
// never share an ID and a name always maps to the same one.
func ReplicaID(name string) string {
	var b strings.Builder
	clean := name != ""
	for _, c := range name {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
			b.WriteRune(c)
		default:
			b.WriteByte('-')
			clean = false
		}
	}
	id := b.String()
	if clean && len(id) <= kvroute.MaxIDBytes {
		return id
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(name))
	sum := fmt.Sprintf("%016x", h.Sum64())
	if n := kvroute.MaxIDBytes - len(sum) - 1; len(id) > n {
		id = id[:n]
	}
	return id + "-" + sum
}
