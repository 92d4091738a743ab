package sim

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// Config is the fleet the workload is replayed on. The zero value of a field
// takes the default of DefaultConfig.
type Config struct {
	// Replicas is the fleet size, 1..64.
	Replicas int `json:"replicas"`
	// CapacityBlocks is each engine's KV cache in blocks of the workload's
	// block size; running requests pin their blocks, the rest is LRU cache.
	CapacityBlocks int `json:"capacity_blocks"`
	// PrefillTPS is prompt tokens computed per second (one prefill at a
	// time per engine; cached blocks are skipped).
	PrefillTPS float64 `json:"prefill_tps"`
	// DecodeTPS is tokens per second per running request.
	DecodeTPS float64 `json:"decode_tps"`
	// DecodeSlowdown makes decode memory-bandwidth bound, as a real
	// engine's is: every step reads the KV of the whole batch, so each
	// decoding request runs at DecodeTPS/(1+DecodeSlowdown*u), u the share
	// of the cache held by requests in their decode phase. 0 (the
	// default) keeps the fixed per-request rate of the seed's models, in
	// which stacking requests on one replica costs no decode speed; 1
	// halves decode speed when decoding requests fill the cache.
	DecodeSlowdown float64 `json:"decode_slowdown,omitempty"`
	// MaxBatch bounds the requests an engine runs at once.
	MaxBatch int `json:"max_batch"`
	// EventDelay is how long an engine's cache events take to reach the
	// router's index.
	EventDelay time.Duration `json:"event_delay_ns"`
	// EventLoss is the probability that one event batch (one admission's
	// removals, one prefill's stores) never reaches the router.
	EventLoss float64 `json:"event_loss"`
	// DropRemovals loses every removal event: the router's index is then
	// as stale as a text prefix tree that is not eviction-aware.
	DropRemovals bool `json:"drop_removals"`
	// RecordDecisions also records each dispatch as approximate entries
	// (scoring's Approx), as the service does for replicas without events.
	// They never expire in the simulator.
	RecordDecisions bool `json:"record_decisions"`
	// DecodeBooking is what the router's load view books as a request's
	// decode blocks: BookOutput (output blocks only: the decode work the
	// replica owes, what router/ books and the seed's section 3 batch
	// model uses) or BookActive (prompt plus output blocks, the KV the
	// request holds while it runs, Dynamo's "active blocks"; it lets one
	// decoding request outweigh a whole prompt's cache hit). Empty means
	// BookOutput.
	DecodeBooking string `json:"decode_booking,omitempty"`
	// Seed drives tie-breaks, power-of-two sampling and event loss.
	Seed uint64 `json:"seed"`
	// Admission is the fleet's admission policy, run through the
	// service's own code (admission.HasRoom, admission.Queue): a request
	// no replica has room for waits in the model's queue. It acts only
	// when Enabled with a limit set (see admission.go in this package);
	// otherwise a run is exactly as without it.
	Admission admission.Config `json:"admission,omitzero"`
	// Model names the simulated fleet's one model, for Admission.Models.
	Model string `json:"model,omitempty"`
	// TimelineBins is the resolution of the load-over-time series (100).
	TimelineBins int `json:"-"`
}

// DefaultConfig is an 8-replica fleet calibrated so that the Mooncake
// synthetic trace loads it meaningfully: 10k prefill tokens/s, 30 decode
// tokens/s per request, 64 requests a batch, and 2048 blocks of cache
// (1M tokens at the trace's 512-token blocks: about a third of the trace's
// distinct blocks fit in 8 replicas), events delivered after 10 ms with no
// loss.
func DefaultConfig() Config {
	return Config{
		Replicas:       8,
		CapacityBlocks: 2048,
		PrefillTPS:     10_000,
		DecodeTPS:      30,
		MaxBatch:       64,
		EventDelay:     10 * time.Millisecond,
		TimelineBins:   100,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Replicas == 0 {
		c.Replicas = d.Replicas
	}
	if c.CapacityBlocks == 0 {
		c.CapacityBlocks = d.CapacityBlocks
	}
	if c.PrefillTPS == 0 {
		c.PrefillTPS = d.PrefillTPS
	}
	if c.DecodeTPS == 0 {
		c.DecodeTPS = d.DecodeTPS
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = d.MaxBatch
	}
	if c.TimelineBins == 0 {
		c.TimelineBins = d.TimelineBins
	}
	return c
}

// Validate rejects a fleet the model cannot run.
func (c Config) Validate() error {
	switch {
	case c.Replicas < 1 || c.Replicas > 64:
		return fmt.Errorf("sim: replicas must be in 1..64, got %d", c.Replicas)
	case c.CapacityBlocks < 1:
		return fmt.Errorf("sim: capacity must be >= 1 block, got %d", c.CapacityBlocks)
	case !(c.PrefillTPS > 0) || !(c.DecodeTPS > 0) || math.IsInf(c.PrefillTPS, 0) || math.IsInf(c.DecodeTPS, 0):
		return errors.New("sim: prefill and decode rates must be finite and > 0")
	case c.MaxBatch < 1:
		return fmt.Errorf("sim: max batch must be >= 1, got %d", c.MaxBatch)
	case c.EventDelay < 0:
		return errors.New("sim: event delay must be >= 0")
	case c.DecodeBooking != "" && c.DecodeBooking != BookActive && c.DecodeBooking != BookOutput:
		return fmt.Errorf("sim: decode booking must be %q or %q, got %q", BookActive, BookOutput, c.DecodeBooking)
	case !(c.DecodeSlowdown >= 0) || math.IsInf(c.DecodeSlowdown, 0):
		return fmt.Errorf("sim: decode slowdown must be a finite number >= 0, got %v", c.DecodeSlowdown)
	case !(c.EventLoss >= 0 && c.EventLoss <= 1):
		return fmt.Errorf("sim: event loss must be in 0..1, got %v", c.EventLoss)
	}
	return nil
}

// Decode bookings (router.DecodeBooking's values, as Config strings).
const (
	BookActive = string(router.BookActive)
	BookOutput = string(router.BookOutput)
)

type evKind uint8

const (
	evArrive evKind = iota
	evPrefillDone
	evDecodeDone
	evStore
	evRemove
	evExpire
)

type event struct {
	at   time.Duration
	seq  uint64
	gen  uint64 // evDecodeDone under DecodeSlowdown: stale unless engine.gen
	kind evKind
	rep  int32
	req  int32
	keys []kvroute.BlockKey
}

// before orders the event queue: by time, then by insertion, so that
// simultaneous events run in the order they were scheduled.
func (e event) before(o event) bool {
	if e.at != o.at {
		return e.at < o.at
	}
	return e.seq < o.seq
}

// minHeap is a container/heap of T, smallest (by before) first: the
// event queue and each engine's decode queue.
type minHeap[T interface{ before(T) bool }] []T

func (h minHeap[T]) Len() int           { return len(h) }
func (h minHeap[T]) Less(i, j int) bool { return h[i].before(h[j]) }
func (h minHeap[T]) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *minHeap[T]) Push(x any)        { *h = append(*h, x.(T)) }
func (h *minHeap[T]) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// reqState is what the run learns about one request.
type reqState struct {
	rep             int32
	arrive, start   time.Duration
	first, done     time.Duration
	servedTok       int
	believedTok     int
	lease           kvroute.Lease
	outBlocks       int
	vTarget         float64 // DecodeSlowdown: engine.vTok at which decode ends
	fresh           []kvroute.BlockKey
	followers       []int32
	routed, started bool
	finished        bool
	// Admission (only when it is active): the fairness charge, whether
	// the request waited in the queue, and why it was shed.
	cost   int64
	queued bool
	shed   string
}

type engine struct {
	cache   *blockCache
	waiting []int32
	wHead   int
	busy    bool // prefilling
	running int
	anon    int // blocks held by decode output
	// accounting
	busyFrom, busySum   time.Duration // time with >= 1 running request
	prefillSum          time.Duration
	requests            int
	promptTok, servedTk int64
	outstanding         int
	decodeBlocks        int // KV blocks of requests in their decode phase
	// Under DecodeSlowdown every decoding request on the engine advances
	// at the same, changing, rate, so progress is kept on one clock: vTok
	// tokens per request by vAt, at vRate tokens/s. dq orders decoding
	// requests by the vTok at which they finish; gen invalidates the one
	// scheduled completion when the rate changes.
	vTok  float64
	vAt   time.Duration
	vRate float64
	dq    minHeap[decoding]
	gen   uint64
}

type change struct {
	at    time.Duration
	rep   int32
	count int32
}

type run struct {
	cfg     Config
	sc      scoring.Config
	w       *Workload
	bt      int
	now     time.Duration
	seq     uint64
	h       minHeap[event]
	reqs    []reqState
	eng     []engine
	view    *RouterView
	loss    *rand.Rand
	last    map[string]int32
	sticky  [2]int
	trail   []change // outstanding requests per replica
	kvTrail []change // decode-phase KV blocks per replica
	scratch []kvroute.BlockKey
	adm     *admitter // nil: admission is not active
	err     error     // the first error of an event handler that returns none
}

func (r *run) push(e event) {
	r.seq++
	e.seq = r.seq
	heap.Push(&r.h, e)
}

// Run replays w on cfg's fleet, routing every request through
// router.Decide under sc (the service's decision core, through a
// RouterView), and reports what the engines did. The same inputs give the
// same report.
func Run(ctx context.Context, cfg Config, sc scoring.Config, w Workload) (Report, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return Report{}, err
	}
	if err := sc.Validate(); err != nil {
		return Report{}, err
	}
	if err := cfg.Admission.Validate(); err != nil {
		return Report{}, fmt.Errorf("sim: %w", err)
	}
	if w.BlockTokens <= 0 {
		return Report{}, errors.New("sim: workload block tokens must be > 0")
	}
	for i, q := range w.Requests {
		if q.Follows < 0 || q.Follows > i {
			return Report{}, fmt.Errorf("sim: request %d follows %d, which is not earlier", i, q.Follows-1)
		}
	}
	n := cfg.Replicas
	r := &run{
		cfg: cfg, sc: sc, w: &w, bt: w.BlockTokens,
		reqs: make([]reqState, len(w.Requests)),
		eng:  make([]engine, n),
		loss: rand.New(rand.NewPCG(cfg.Seed, 2)),
		last: make(map[string]int32),
	}
	// MaxTokens 0: a trace's output length is known, and a request with
	// none owes no decode.
	rcfg := router.Config{Scoring: sc, BlockSize: w.BlockTokens, DecodeBooking: router.DecodeBooking(cfg.DecodeBooking), PrefillTPS: cfg.PrefillTPS}
	view, err := NewRouterView(n, rcfg, !cfg.RecordDecisions, rand.New(rand.NewPCG(cfg.Seed, 1)))
	if err != nil {
		return Report{}, err
	}
	r.view = view
	r.adm = newAdmitter(cfg)
	for i := range r.eng {
		r.eng[i].cache = newBlockCache()
	}
	for i, chains := range w.Warm {
		if i >= n {
			break
		}
		for _, ch := range chains {
			for _, k := range ch {
				r.eng[i].cache.touch(k)
			}
			r.view.Apply(true, i, kvroute.TierGPU, ch, time.Time{})
		}
		r.eng[i].cache.evictTo(cfg.CapacityBlocks, nil)
	}
	for i, q := range w.Requests {
		if q.Follows > 0 {
			r.reqs[q.Follows-1].followers = append(r.reqs[q.Follows-1].followers, int32(i))
			continue
		}
		r.push(event{at: q.Arrival, kind: evArrive, req: int32(i)})
	}
	steps := 0
	for r.h.Len() > 0 {
		if steps++; steps&1023 == 0 {
			if err := ctx.Err(); err != nil {
				return Report{}, err
			}
		}
		e := heap.Pop(&r.h).(event)
		r.now = e.at
		switch e.kind {
		case evArrive:
			if err := r.arrive(e.req); err != nil {
				return Report{}, err
			}
		case evPrefillDone:
			r.prefillDone(e.req)
		case evDecodeDone:
			if r.cfg.DecodeSlowdown > 0 {
				r.slowDecodeDone(int(e.rep), e.gen)
				break
			}
			r.decodeDone(e.req)
		case evStore:
			r.apply(true, int(e.rep), e.keys)
		case evRemove:
			r.apply(false, int(e.rep), e.keys)
		case evExpire:
			r.expire()
		}
		if r.err != nil {
			return Report{}, r.err
		}
	}
	return r.report(), nil
}

// arrive routes a request through the router's view, or, with admission
// active, admits it or queues it (admit).
func (r *run) arrive(i int32) error {
	r.reqs[i].arrive = r.now
	if r.adm != nil {
		return r.admit(i)
	}
	return r.route(i, nil)
}

// route decides a request through the router's view (one router.Decide,
// which books the lease) among the replicas eligible marks (nil: all) and
// hands it to the engine.
func (r *run) route(i int32, eligible []bool) error {
	q := &r.w.Requests[i]
	st := &r.reqs[i]
	out, err := r.view.Decide(Ask{
		Keys: q.Keys, PromptTokens: q.PromptTokens, BlockSize: r.bt,
		MaxTokens: q.OutputTokens, SessionID: q.Session, Now: time.Time{}.Add(r.now),
		Eligible: eligible,
	})
	if err != nil {
		return fmt.Errorf("sim: request %d: %w", i, err)
	}
	p := out.Pick
	st.rep, st.routed = int32(p), true
	st.believedTok = min(out.Matched*r.bt, q.PromptTokens)
	st.lease = out.Lease
	st.outBlocks = int(router.OutputBlocks(q.OutputTokens, r.bt))
	if q.Session != "" {
		if prev, ok := r.last[q.Session]; ok {
			r.sticky[1]++
			if prev == int32(p) {
				r.sticky[0]++
			}
		}
		r.last[q.Session] = int32(p)
	}
	e := &r.eng[p]
	e.requests++
	e.outstanding++
	r.trail = append(r.trail, change{r.now, int32(p), int32(e.outstanding)})
	e.waiting = append(e.waiting, i)
	r.tryStart(p)
	return nil
}

// tryStart admits waiting requests in FIFO order while the engine has a
// free prefill slot, batch room and memory.
func (r *run) tryStart(p int) {
	e := &r.eng[p]
	for !e.busy && e.wHead < len(e.waiting) && e.running < r.cfg.MaxBatch {
		i := e.waiting[e.wHead]
		q := &r.w.Requests[i]
		st := &r.reqs[i]
		need := e.cache.pinned + e.cache.newPins(q.Keys) + e.anon + st.outBlocks
		if need > r.cfg.CapacityBlocks && e.running > 0 {
			return // head-of-line: wait for memory
		}
		e.wHead++
		if e.wHead == len(e.waiting) {
			e.waiting, e.wHead = e.waiting[:0], 0
		}
		served := e.cache.match(q.Keys)
		st.servedTok = min(served*r.bt, q.PromptTokens)
		for _, k := range q.Keys {
			if e.cache.pin(k) {
				st.fresh = append(st.fresh, k)
			}
		}
		e.anon += st.outBlocks
		r.evict(p)
		st.start, st.started = r.now, true
		if e.running == 0 {
			e.busyFrom = r.now
		}
		e.running++
		e.busy = true
		e.promptTok += int64(q.PromptTokens)
		e.servedTk += int64(st.servedTok)
		d := seconds(float64(max(q.PromptTokens-st.servedTok, 1)) / r.cfg.PrefillTPS)
		e.prefillSum += d
		r.push(event{at: r.now + d, kind: evPrefillDone, rep: int32(p), req: i})
	}
}

func (r *run) evict(p int) {
	e := &r.eng[p]
	r.scratch = e.cache.evictTo(max(r.cfg.CapacityBlocks-e.anon, 0), r.scratch[:0])
	if len(r.scratch) > 0 {
		r.emit(false, p, append([]kvroute.BlockKey(nil), r.scratch...))
	}
}

// emit sends one event batch towards the router, subject to loss and delay.
func (r *run) emit(store bool, p int, keys []kvroute.BlockKey) {
	if !store && r.cfg.DropRemovals {
		return
	}
	if r.cfg.EventLoss > 0 && r.loss.Float64() < r.cfg.EventLoss {
		return
	}
	if r.cfg.EventDelay == 0 {
		r.apply(store, p, keys)
		return
	}
	k := evRemove
	if store {
		k = evStore
	}
	r.push(event{at: r.now + r.cfg.EventDelay, kind: k, rep: int32(p), keys: keys})
}

func (r *run) apply(store bool, p int, keys []kvroute.BlockKey) {
	r.view.Apply(store, p, kvroute.TierGPU, keys, time.Time{}.Add(r.now))
}

func (r *run) prefillDone(i int32) {
	st := &r.reqs[i]
	q := &r.w.Requests[i]
	p := int(st.rep)
	e := &r.eng[p]
	e.busy = false
	st.first = r.now
	if len(st.fresh) > 0 {
		r.emit(true, p, st.fresh)
		st.fresh = nil
	}
	r.view.FirstToken(p, st.lease, time.Time{}.Add(r.now))
	tokens := float64(max(q.OutputTokens-1, 0))
	if r.cfg.DecodeSlowdown > 0 {
		r.advance(p)
		st.vTarget = e.vTok + tokens
		heap.Push(&e.dq, decoding{st.vTarget, i})
	}
	e.decodeBlocks += len(q.Keys) + st.outBlocks
	r.kvTrail = append(r.kvTrail, change{r.now, int32(p), int32(e.decodeBlocks)})
	if r.cfg.DecodeSlowdown > 0 {
		r.reschedule(p)
	} else {
		r.push(event{at: r.now + seconds(tokens/r.cfg.DecodeTPS), kind: evDecodeDone, rep: int32(p), req: i})
	}
	r.tryStart(p)
	if r.adm != nil {
		r.dispatch()
	}
}

func (r *run) decodeDone(i int32) {
	st := &r.reqs[i]
	q := &r.w.Requests[i]
	p := int(st.rep)
	e := &r.eng[p]
	st.done, st.finished = r.now, true
	// Release tail first so that, as in vLLM's free queue, a prompt's head
	// blocks are the most recently used and evicted last.
	for j := len(q.Keys) - 1; j >= 0; j-- {
		e.cache.unpin(q.Keys[j])
	}
	e.anon -= st.outBlocks
	var stored []kvroute.BlockKey
	for j := len(q.DecodeKeys) - 1; j >= 0; j-- {
		if e.cache.touch(q.DecodeKeys[j]) {
			stored = append(stored, q.DecodeKeys[j])
		}
	}
	if len(stored) > 0 {
		r.emit(true, p, stored)
	}
	r.evict(p)
	e.running--
	if e.running == 0 {
		e.busySum += r.now - e.busyFrom
	}
	e.outstanding--
	r.trail = append(r.trail, change{r.now, int32(p), int32(e.outstanding)})
	e.decodeBlocks -= len(q.Keys) + st.outBlocks
	r.kvTrail = append(r.kvTrail, change{r.now, int32(p), int32(e.decodeBlocks)})
	r.view.Release(p, st.lease)
	r.startFollowers(st)
	r.tryStart(p)
	if r.adm != nil {
		r.adm.inFlight--
		r.dispatch()
	}
}

// startFollowers sends the next turns of a request that ended.
func (r *run) startFollowers(st *reqState) {
	for _, f := range st.followers {
		r.push(event{at: r.now + r.w.Requests[f].Arrival, kind: evArrive, req: f})
	}
}

func seconds(s float64) time.Duration { return time.Duration(math.Round(s * float64(time.Second))) }

// advance moves engine p's decode clock to now at its current rate.
func (r *run) advance(p int) {
	e := &r.eng[p]
	e.vTok += e.vRate * (r.now - e.vAt).Seconds()
	e.vAt = r.now
}

// reschedule sets engine p's decode rate from the KV its decoding
// requests hold and schedules the next of them to finish, superseding any
// completion scheduled at the old rate. Call advance first.
func (r *run) reschedule(p int) {
	e := &r.eng[p]
	u := float64(e.decodeBlocks) / float64(r.cfg.CapacityBlocks)
	e.vRate = r.cfg.DecodeTPS / (1 + r.cfg.DecodeSlowdown*u)
	e.gen++
	if len(e.dq) == 0 {
		return
	}
	d := seconds(math.Max(e.dq[0].target-e.vTok, 0) / e.vRate)
	r.push(event{at: r.now + d, kind: evDecodeDone, rep: int32(p), gen: e.gen})
}

// slowDecodeDone finishes engine p's next decoding request, unless the
// event was superseded by a rate change.
func (r *run) slowDecodeDone(p int, gen uint64) {
	e := &r.eng[p]
	if gen != e.gen || len(e.dq) == 0 {
		return
	}
	r.advance(p)
	d := heap.Pop(&e.dq).(decoding)
	e.vTok = math.Max(e.vTok, d.target) // shed the rounding of the event time
	r.decodeDone(d.req)
	r.reschedule(p)
}

// decoding is one request in an engine's decode queue.
type decoding struct {
	target float64
	req    int32
}

// before orders an engine's decode queue: by target, then by request
// index, so that equal targets finish in a deterministic order.
func (d decoding) before(o decoding) bool {
	if d.target != o.target {
		return d.target < o.target
	}
	return d.req < o.req
}
