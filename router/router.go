// Package router makes one routing decision: it keys the prompt, asks the
// index what every replica holds and what it owes, hands that to scoring,
// and books the chosen replica's new load. It knows neither HTTP nor Redis:
// it declares the small interfaces it needs, and the store satisfies them.
package router

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	mrand "math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/scoring"
)

// Index is what a decision needs from the state store.
type Index interface {
	// Lookup returns, per replica in order, the leading blocks of keys it
	// holds and the load it owes, in one round trip.
	Lookup(ctx context.Context, model string, keys []kvroute.BlockKey, replicas []string) ([]kvroute.Overlap, []kvroute.Load, error)
	// Reserve books a lease if the replica's load version is still
	// ifVersion (any version when negative); otherwise it returns the
	// current load so the decision can be re-scored.
	Reserve(ctx context.Context, lease kvroute.Lease, ifVersion int64) (bool, kvroute.Load, error)
	// ReserveWithin books a lease if the replica's booked counters are
	// all at most max's, whatever the version; otherwise it returns the
	// current load.
	ReserveWithin(ctx context.Context, lease kvroute.Lease, max kvroute.Load) (bool, kvroute.Load, error)
	// ReserveBest books a lease on the cheapest of choices by their loads
	// as they are when it runs (the kv cost, kvroute.ChoiceCost), with the
	// chosen one's replica and prefill, and returns its index (-1 when the
	// cheapest is not under cost.Bound: nothing booked) and every choice's
	// load as it found them, or none when it booked the first choice (the
	// caller's pick, as scored).
	ReserveBest(ctx context.Context, lease kvroute.Lease, choices []kvroute.Choice, cost kvroute.ChoiceCost) (int, []kvroute.Load, error)
	// RecordApprox remembers that replica was sent these keys.
	RecordApprox(ctx context.Context, model, replica string, keys []kvroute.BlockKey) error
	// Advance reports a request's first token: its prefill is done, so the
	// prefill its lease booked is released and the decode stays booked.
	// It reports whether anything changed (false for an unknown, released
	// or already advanced request).
	Advance(ctx context.Context, requestID string) (bool, error)
	// Release ends a request: everything its lease booked is released.
	// It reports false for an unknown or already released request.
	Release(ctx context.Context, requestID string) (bool, error)
	// Loads returns, per replica in order, the load booked on it: a
	// decision whose booking lost a race re-reads them all before it
	// scores again.
	Loads(ctx context.Context, model string, replicas []string) ([]kvroute.Load, error)
}

// RequestIDMinter is an index that mints its own request ids (*store.Store
// is one, checked in internal/app): its ids carry their model, so that
// Advance and Release find the lease in the model's Redis slot. The router
// finds it by type assertion on the Index (Options.NewID); the named
// interface and its compile-time check keep a renamed method from silently
// falling back to random ids.
type RequestIDMinter interface {
	// NewRequestID mints the id of a decision on model.
	NewRequestID(model string) string
}

// Registry lists the fleet.
type Registry interface {
	// ListReplicas returns every registered replica; decisions cache it
	// for Config.RegistryTTL and route over the last copy when it fails.
	ListReplicas(ctx context.Context) ([]kvroute.Replica, error)
}

// Config is the router's tuning.
type Config struct {
	Scoring scoring.Config
	// BlockSize is the tokens per block for a model that is neither in
	// BlockSizes nor served by replicas that agree on a reported size.
	BlockSize int
	// BlockSizes pins a model's block size over what its replicas report.
	BlockSizes map[string]int
	// Seed is mixed into every block key (the KeySpace seed).
	Seed uint64
	// LeaseTTL is the minimum life of a booking; the predicted duration of
	// the request is added to it.
	LeaseTTL time.Duration
	// PrefillTPS and DecodeTPS are conservative engine speeds, used to
	// predict when a lease may safely expire and (PrefillTPS) when a
	// predicted entry's prefill is due.
	PrefillTPS, DecodeTPS float64
	// PredictGrace is how long a predicted entry outlives its prefill's
	// due time, waiting for the event that confirms it; zero means
	// DefaultPredictGrace.
	PredictGrace time.Duration
	// RegistryTTL bounds how stale the in-process copy of the registry may
	// be. It is a cache: every pod re-reads the registry from the store.
	RegistryTTL time.Duration
	// MaxTokens is the output length assumed when a request gives none.
	MaxTokens int
	// StoreBackoff is how long decisions skip the store after it failed:
	// during an outage every decision is degraded at once instead of
	// waiting out a connection attempt first.
	StoreBackoff time.Duration
	// StoreTimeout bounds each store call of a decision or a progress
	// report, well inside the request's own deadline, so that a hung
	// store turns decisions degraded instead of stalling them; zero means
	// 250 ms.
	StoreTimeout time.Duration
	// DecodeBooking is what a decision books as decode work; empty means
	// BookOutput, the service's default.
	DecodeBooking DecodeBooking
	// MaxLease caps a booking's life; zero means MaxLease (one hour).
	MaxLease time.Duration
	// Admission is the fleet's admission policy (admit.go); its zero
	// value admits every request at once, as before admission.
	Admission admission.Config
}

// DefaultConfig is what `kvroute serve` starts with.
func DefaultConfig() Config {
	return Config{
		Scoring:      scoring.DefaultConfig(),
		BlockSize:    kvroute.DefaultBlockSize,
		LeaseTTL:     30 * time.Second,
		PrefillTPS:   2000,
		DecodeTPS:    10,
		RegistryTTL:  250 * time.Millisecond,
		MaxTokens:    256,
		StoreBackoff: time.Second,
		StoreTimeout: 250 * time.Millisecond,
	}
}

// Router decides. It is safe for concurrent use.
type Router struct {
	idx    Index
	reg    Registry
	cfg    Config
	now    func() time.Time
	log    *slog.Logger
	newID  func(model string) string
	mu     sync.Mutex
	rng    *mrand.Rand
	count  atomic.Uint64
	cached registryCache
	// down holds the store's back-off windows (backoff.go).
	down backoff
	// progress holds first-token and release reports the store could not
	// take; Run retries them.
	progress progressQueue
	// reset is what survives the store losing its data (reset.go).
	reset   resetState
	onReset func(ctx context.Context, known []kvroute.Replica)
	// suspects are replicas recently seen failing (suspect.go).
	suspects suspectSet
	tracer   trace.Tracer
	// domains is idx's answer about its failure domains; nil when it has
	// none (backoff.go).
	domains Domains
	// adm is this pod's part of admission (queue.go); nil when it is off.
	adm *admitter
}

// Options are the router's injected dependencies; each nil field gets the
// default its comment names.
type Options struct {
	// Now is the clock leases expire by; nil means time.Now.
	Now func() time.Time
	// Logger receives degraded-mode warnings; nil discards them.
	Logger *slog.Logger
	// Rand breaks ties and samples power-of-two; nil means a randomly
	// seeded source (seed it in tests).
	Rand *mrand.Rand
	// OnStoreReset is called when the store is found to have lost its
	// data, with this pod's last copy of the registry, to write it back;
	// nil means nobody re-seeds (the decisions of the reset window still
	// fall back to that copy).
	OnStoreReset func(ctx context.Context, known []kvroute.Replica)
	// NewID mints the request id of a decision on model; nil means the
	// index's NewRequestID when it is a RequestIDMinter (the store's ids
	// carry their model, so that Advance and Release find its lease in its
	// model's Redis slot), else random 128-bit hex.
	NewID func(model string) string
	// TracerProvider makes the decision steps' spans (trace.go); nil
	// means the global provider, a no-op unless the program sets one.
	TracerProvider trace.TracerProvider
	// MeterProvider makes admission's instruments (admitmetrics.go); nil
	// means a no-op.
	MeterProvider metric.MeterProvider
	// Queue is the shared admission queue used when Config.Admission is
	// enabled; nil means the index, when it is a Queue (the store is).
	Queue Queue
	// Pod names this process to the queue, which tells it of its queued
	// requests' seats on a channel of that name; empty means a random id.
	Pod string
}

// New builds a Router.
func New(idx Index, reg Registry, cfg Config, opt Options) (*Router, error) {
	if err := cfg.Scoring.Validate(); err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	if cfg.BlockSize <= 0 {
		return nil, errors.New("router: block size must be positive")
	}
	if err := validBooking(cfg.DecodeBooking); err != nil {
		return nil, fmt.Errorf("router: %w", err)
	}
	if cfg.StoreTimeout <= 0 {
		cfg.StoreTimeout = 250 * time.Millisecond
	}
	if cfg.StoreBackoff <= 0 {
		cfg.StoreBackoff = time.Second
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Logger == nil {
		opt.Logger = slog.New(slog.DiscardHandler)
	}
	if opt.Rand == nil {
		var seed [16]byte
		_, _ = rand.Read(seed[:])
		opt.Rand = mrand.New(mrand.NewPCG(leU64(seed[:8]), leU64(seed[8:])))
	}
	if opt.NewID == nil {
		opt.NewID = func(string) string { return randomID() }
		if m, ok := idx.(RequestIDMinter); ok {
			opt.NewID = m.NewRequestID
		}
	}
	r := &Router{idx: idx, reg: reg, cfg: cfg, now: opt.Now, log: opt.Logger, newID: opt.NewID, rng: opt.Rand, onReset: opt.OnStoreReset,
		tracer: newTracer(opt.TracerProvider), domains: domainsOf(idx), progress: progressQueue{wake: make(chan struct{}, 1)}}
	if cfg.Admission.Enabled {
		if err := r.admitWith(opt); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// BlockSize is the block size requests for model are keyed with, given the
// model's replicas: a size pinned in BlockSizes, else the size every
// replica that reported one agrees on, else the configured default. The
// index is keyed with the size in the replicas' own events, so a reported
// size beats a configured guess; replicas that disagree cannot all be
// matched, and the default is used.
func (r *Router) BlockSize(model string, fleet []kvroute.Replica) int {
	if bs, ok := r.cfg.BlockSizes[model]; ok && bs > 0 {
		return bs
	}
	reported := 0
	for _, rep := range fleet {
		switch {
		case rep.BlockSize <= 0:
		case reported == 0:
			reported = rep.BlockSize
		case rep.BlockSize != reported:
			return r.cfg.BlockSize
		}
	}
	if reported > 0 {
		return reported
	}
	return r.cfg.BlockSize
}

// KeySpace is the key space a request for model and adapter falls in.
func (r *Router) KeySpace(model, lora string) kvroute.KeySpace {
	return kvroute.KeySpace{Model: model, LoRA: lora, Seed: r.cfg.Seed}
}

// Route answers one request. With the store unreachable it still decides
// (round-robin over the last replicas it knew to be healthy) and says so in
// Decision.Degraded rather than failing while any replica is known. Each
// step is a child span of the caller's (kvroute.registry, kvroute.keying,
// kvroute.lookup, kvroute.scoring, kvroute.reserve) and is timed in
// Decision.Stages. A request Check refuses is answered with its
// *RequestError; a model with no replica with a *ModelNotFoundError.
func (r *Router) Route(ctx context.Context, req Request) (Decision, error) {
	var tm Stages
	d, err := r.route(ctx, req, &tm)
	d.Stages = tm
	return d, err
}

// route is Route, timing its steps in tm: a decision, and under
// admission, when no replica has room, a wait in the queue for a seat
// and the decision again, holding it.
func (r *Router) route(ctx context.Context, req Request, tm *Stages) (Decision, error) {
	if err := req.Check(); err != nil {
		return Decision{}, err
	}
	d, ask, err := r.decideOnce(ctx, req, tm, "", "")
	if err != nil || ask == nil {
		return d, r.admitted(req, d, err)
	}
	qctx, st := r.stage(ctx, "kvroute.queue", nil)
	start := r.now()
	seat, err := r.adm.wait(qctx, r, req, ask.id, ask.cost, ask.cold)
	waited := r.now().Sub(start)
	if errors.Is(err, kvroute.ErrUnavailable) {
		// The queue is away with the store: decide degraded, within
		// this pod's share (fallback.go).
		st.end(err)
		r.markDown(r.modelWindow(req.Model))
		d, _, err = r.decideOnce(ctx, req, tm, "", "")
		return d, r.admitted(req, d, err)
	}
	st.end(err, attribute.String("kvroute.replica", seat), attribute.Int64("kvroute.queued_ms", waited.Milliseconds()),
		attribute.Int("kvroute.priority", req.Priority), attribute.String("kvroute.tenant", req.Tenant))
	if err != nil {
		return Decision{}, err
	}
	d, _, err = r.decideOnce(ctx, req, tm, ask.id, seat)
	if err != nil {
		// The seat goes back to the queue now rather than at its expiry.
		r.adm.leave(ctx, r, ask.id)
		return Decision{}, err
	}
	d.Queued = waited
	r.adm.m.admittedAfter(req, max(waited, time.Nanosecond))
	return d, nil
}

// admitted accounts for a decision made at once under admission: a
// degraded one (the store unreachable) counts against this pod's
// fallback share, or is shed by it.
func (r *Router) admitted(req Request, d Decision, err error) error {
	if err != nil || r.adm == nil {
		return err
	}
	if d.Degraded && d.Reason != ReasonStoreReset {
		return r.adm.fallback(req, d)
	}
	r.adm.m.admittedAfter(req, 0)
	return nil
}

// queueAsk is a decision that found no replica with room: it queues as
// id, charged cost; cold says the model has no replica up at all.
type queueAsk struct {
	id   string
	cost int64
	cold bool
}

// decideOnce is one decision: with id and seat empty, a new request's;
// otherwise the decision of request id, which holds a seat on replica
// seat. Under admission it answers a queueAsk, and no Decision, when no
// replica has room.
func (r *Router) decideOnce(ctx context.Context, req Request, tm *Stages, id, seat string) (Decision, *queueAsk, error) {
	cfg := r.cfg.Scoring
	if req.Policy != "" {
		cfg.Policy = req.Policy
	}
	sctx, st := r.stage(ctx, "kvroute.registry", &tm.Registry)
	replicas, read, err := r.replicas(sctx, req.Model)
	st.end(err, attribute.Bool("kvroute.stale", read != fleetRead))
	if err != nil {
		return Decision{}, nil, err
	}
	// The index is skipped while the model's window is open, and by the
	// decision whose registry read just failed (with one Redis the lookup
	// would fail too, after a second wait; the failure opened the window
	// of every model in the registry's domain). A registry in its window
	// is no reason to skip it: the model's shard may be up.
	skip := read == fleetFailed || read == fleetSkipped
	fleet := modelFleet(replicas, req.Model)
	resetting := r.resetting(fleet)
	if id == "" {
		id = r.newID(req.Model)
	}
	if len(fleet) == 0 {
		if r.adm != nil && seat == "" && !skip && r.adm.mayColdStart(req.Model) {
			r.adm.describe(ctx, r, req.Model, r.BlockSize(req.Model, nil), candidates{}, nil)
			return Decision{}, &queueAsk{id: id, cost: coldCost(r.cfg, req), cold: true}, nil
		}
		d, err := r.vanished(ctx, req.Model)
		return d, nil, err
	}
	fleet = r.suspects.demote(r.now(), fleet)
	cands := expand(fleet)
	bs := r.BlockSize(req.Model, fleet)
	_, st = r.stage(ctx, "kvroute.keying", &tm.Keying)
	keys := kvroute.BlockKeys(r.KeySpace(req.Model, req.LoRA), bs, req.Tokens, kvroute.RequestExtras(req.CacheSalt))
	st.end(nil, attribute.Int("kvroute.prompt_blocks", len(keys)), attribute.Int("kvroute.block_size", bs))
	d := Decision{RequestID: id, PromptBlocks: len(keys), BlockSize: bs, Policy: cfg.Policy}

	var overlaps []kvroute.Overlap
	var loads []kvroute.Load
	if !skip {
		lctx, st := r.stage(ctx, "kvroute.lookup", &tm.Lookup)
		sctx, cancel := r.storeCtx(lctx)
		overlaps, loads, err = r.idx.Lookup(sctx, req.Model, keys, cands.ids)
		cancel()
		st.end(err, attribute.Int("kvroute.candidates", len(cands.fleet)))
		overlaps, loads = cands.foldOverlaps(overlaps), cands.foldLoads(loads)
	}
	if skip || err != nil {
		if err != nil && !errors.Is(err, kvroute.ErrUnavailable) {
			return Decision{}, nil, fmt.Errorf("router: lookup: %w", err)
		}
		if err != nil {
			r.markDown(r.modelWindow(req.Model))
		}
		d, err := r.degraded(d, fleet, err)
		return d, nil, err
	}
	in := r.input(d, req, cands.fleet, overlaps, loads)
	in.Keys = keys
	out, ask, err := r.admitAndBook(ctx, req, in, loads, cands, seat, tm)
	if ask != nil {
		return Decision{}, ask, nil
	}
	if err != nil {
		if errors.Is(err, kvroute.ErrUnavailable) {
			r.markDown(r.modelWindow(req.Model))
			d, err := r.degraded(d, fleet, err)
			return d, nil, err
		}
		return Decision{}, nil, err
	}
	if resetting {
		// Cache-aware over what the index holds again, but the index is
		// partial until the ingestors' replays land: say so.
		d.Degraded, d.Reason = true, ReasonStoreReset
	}
	r.booked(ctx, &d, req.Model, cands, keys, out)
	return d, nil, nil
}

// admitAndBook books the decision on in, under admission only where there
// is room: a request none has room for answers the queueAsk instead, and
// one holding a seat takes it where the candidates with room filled.
func (r *Router) admitAndBook(ctx context.Context, req Request, in Input, loads []kvroute.Load, cands candidates, seat string, tm *Stages) (Outcome, *queueAsk, error) {
	seatAt := -1
	if r.adm != nil {
		var ask *queueAsk
		if seatAt, ask = r.admitInput(ctx, req, &in, cands, loads, seat); ask != nil {
			return Outcome{}, ask, nil
		}
	}
	out, err := r.book(ctx, req.Model, in, loads, cands, tm)
	if errors.Is(err, kvroute.ErrNoRoom) {
		if seatAt < 0 {
			return Outcome{}, &queueAsk{id: in.RequestID, cost: Cost(r.cfg, in)}, nil
		}
		out, err = r.bookSeat(ctx, in, seatAt, tm)
	}
	return out, nil, err
}

// vanished answers a request for a model the registry has no replica of.
// A model this pod knew has vanished when an operator deleted its
// replicas, or when the store lost its data: only the epoch tells, and in
// the second case the decision goes to the last fleet known.
func (r *Router) vanished(ctx context.Context, model string) (Decision, error) {
	if known := r.reset.knownFleet(model); len(known) > 0 {
		d := Decision{RequestID: r.newID(model), BlockSize: r.BlockSize(model, known), Policy: scoring.PolicyRoundRobin}
		// With the registry's window open the epoch cannot be read
		// either (one server), and asking would wait out the store
		// again: route over the last fleet known rather than say the
		// model does not exist.
		if r.isDown(r.globalWindow()) {
			return r.degraded(d, known, nil)
		}
		// The window is asked after the check, not before it: the
		// serving process's own check may have seen the reset first,
		// and this CheckEpoch then finds the epoch already current (a
		// 404 in a -race run of TestRedisRestartedEmpty).
		reset, err := r.CheckEpoch(ctx)
		if errors.Is(err, kvroute.ErrUnavailable) {
			r.markDown(r.globalWindow())
			return r.degraded(d, known, err)
		}
		if reset || r.resetting(nil) {
			// The registry read that missed the model may be a copy
			// cached before the re-seed: the next decision reads again.
			r.Invalidate()
			return r.degradedWith(d, known, ReasonStoreReset)
		}
	}
	return Decision{}, &ModelNotFoundError{Model: model}
}

// input is what the decision core is given: the request, and each of
// fleet's replicas with what the index says it holds and owes.
func (r *Router) input(d Decision, req Request, fleet []kvroute.Replica, overlaps []kvroute.Overlap, loads []kvroute.Load) Input {
	in := Input{
		RequestID: d.RequestID, Model: req.Model, Blocks: d.PromptBlocks, PromptTokens: len(req.Tokens), BlockSize: d.BlockSize,
		MaxTokens: req.MaxTokens, SessionID: req.SessionID, Policy: req.Policy,
		Counter: r.count.Add(1) - 1, Now: r.now(), Candidates: make([]Candidate, len(fleet)),
	}
	for i, rep := range fleet {
		in.Candidates[i] = Candidate{
			ID: rep.ID, Routable: rep.Routable(), Events: rep.Events != "",
			Overlap: overlaps[i], Load: scoring.LoadOf(loads[i]),
		}
	}
	return in
}

// booked fills d from the booking out made on fleet (model's replicas), and remembers what
// was sent to a replica that publishes no events.
func (r *Router) booked(ctx context.Context, d *Decision, model string, cands candidates, keys []kvroute.BlockKey, out Outcome) {
	p, fleet := out.Pick, cands.fleet
	d.Replica = cands.server(fleet[p])
	d.DataParallelRank, d.Pinned = fleet[p].Rank()
	d.IndexIncomplete = fleet[p].Events != "" && fleet[p].FollowedSince.IsZero()
	d.Policy, d.Mode, d.Candidates = out.Result.Policy, out.Result.Mode, out.Result.Scores
	d.Matched, d.Approximate, d.Expires = out.Matched, out.Approximate, out.Lease.Expires
	if s := out.Result.Scores[p]; s.Matched > s.Held {
		d.PredictedBlocks = s.Predicted // its cost counted them
	}
	d.PredictionCounted, d.PredictionChanged = out.Predicted, out.PredictionChanged
	// Replicas that publish no events are known only from what we send
	// them: remember it, apart from event-fed entries and with a TTL.
	if !out.RecordApprox {
		return
	}
	actx, st := r.stage(ctx, "kvroute.record_approx", nil)
	sctx, cancel := r.storeCtx(actx)
	err := r.idx.RecordApprox(sctx, model, fleet[p].ID, keys)
	cancel()
	st.end(err)
	if err != nil {
		r.log.Warn("record approximate entries", "replica", fleet[p].ID, "err", err)
	}
}

// CanDecide reports whether this pod can answer decisions now: the store
// answers, or it is down and the pod knows a fleet to route over in
// degraded mode. A pod that can decide is ready for traffic; taking every
// pod out of a load balancer because the store hiccuped would turn a
// degraded service into no service.
func (r *Router) CanDecide(ctx context.Context) error {
	c := &r.cached
	c.mu.Lock()
	known := c.valid && len(c.replicas) > 0
	c.mu.Unlock()
	if r.isDown(r.globalWindow()) && known {
		return nil
	}
	if _, _, err := r.replicas(ctx, ""); err != nil {
		return err
	}
	if r.isDown(r.globalWindow()) {
		c.mu.Lock()
		known = c.valid && len(c.replicas) > 0
		c.mu.Unlock()
		if !known {
			return fmt.Errorf("router: the state store is unreachable and no fleet is known: %w", kvroute.ErrUnavailable)
		}
	}
	return nil
}

// StoreUp reports whether no back-off window is open (the store's last
// calls succeeded, for the registry, progress reports and every model):
// the store's state, which /metrics reports apart from readiness.
func (r *Router) StoreUp() bool { return !r.down.open(r.now().UnixNano()) }

// degraded decides without the store: round-robin over the routable
// replicas last seen. Cache awareness is lost; availability is not.
func (r *Router) degraded(d Decision, fleet []kvroute.Replica, cause error) (Decision, error) {
	reason := "state store unreachable"
	if cause == nil {
		reason += " (recently failed; retried within " + r.cfg.StoreBackoff.String() + ")"
	} else {
		reason += ": " + cause.Error()
	}
	d, err := r.degradedWith(d, fleet, reason)
	if err != nil {
		return Decision{}, fmt.Errorf("router: store unreachable and no healthy replica known: %w", kvroute.ErrUnavailable)
	}
	if cause != nil {
		// Once per backoff window, not once per decision.
		r.log.Warn("state store unreachable: deciding round-robin", "backoff", r.cfg.StoreBackoff, "err", cause)
	}
	return d, nil
}

// ReasonStoreReset is the degraded reason of decisions made while the
// store rebuilds after losing its data (reset.go).
const ReasonStoreReset = "state store lost its data: registry re-seeded from this pod's last copy, index rebuilding from the replicas' replay buffers"

// degradedWith decides round-robin over fleet's routable replicas, saying
// reason: what every decision that cannot use the index does.
func (r *Router) degradedWith(d Decision, fleet []kvroute.Replica, reason string) (Decision, error) {
	var ok []kvroute.Replica
	for _, rep := range fleet {
		if rep.Routable() {
			ok = append(ok, rep)
		}
	}
	if len(ok) == 0 {
		return Decision{}, fmt.Errorf("router: no healthy replica known: %w", kvroute.ErrNoReplica)
	}
	d.Replica = ok[(r.count.Add(1)-1)%uint64(len(ok))]
	d.Policy, d.Degraded, d.Reason = scoring.PolicyRoundRobin, true, reason
	return d, nil
}

const (
	// fleetRead is the registry read now, or less than RegistryTTL ago.
	fleetRead fleetSource = iota
	// fleetCached is the last copy, not re-read: the registry's window is
	// open.
	fleetCached
	// fleetSkipped is the last copy, not re-read: the model's window is
	// open, so the decision will not go to the store at all.
	fleetSkipped
	// fleetFailed is the last copy: reading the registry just failed.
	fleetFailed
)

func randomID() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

func leU64(b []byte) uint64 {
	var v uint64
	for i := 7; i >= 0; i-- {
		v = v<<8 | uint64(b[i])
	}
	return v
}
