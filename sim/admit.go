package sim

import (
	"fmt"
	"math"
	"strconv"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
)

// Admission in the simulator runs the service's own policy code: a
// replica has room when admission.HasRoom says so of the load the
// router's view has booked on it (and of its engine's waiting count and
// KV usage, read as a scrape that is always fresh: the model has no
// scrape delay), the fleet holds at most MaxInFlightFor(model) requests,
// and a request no replica has room for waits in an admission.Queue, in
// the dispatch order every kvroute queue follows. Whenever capacity frees
// (a first token, a completion) the queue's heads are popped and routed,
// through router.Decide over the replicas with room only, while some
// replica has room. A ticket past its deadline (arrival plus the queue
// TTL) is shed with ShedTTL, at that moment; one the queue refuses (queue,
// band or tenant full) is shed at once. A shed request never runs, and
// the later turns of a closed-loop session whose turn was shed are never
// sent: the client's loop ended there.
//
// Admission is active only when Config.Admission is Enabled and sets a
// limit (per replica or per fleet): with none, nothing could ever queue,
// and the run takes exactly the path, and gives exactly the report, of a
// run without admission.
type admitter struct {
	cfg         admission.Config
	limits      kvroute.Limits
	maxInFlight int64
	ttl         time.Duration
	queue       *admission.Queue
	inFlight    int64
	room        []bool
	maxLen      int
}

// epoch is the wall time of simulated time 0: not the zero time, which
// admission.HasRoom reads as "never scraped".
var epoch = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// newAdmitter is cfg's admission, or nil when it is not active.
func newAdmitter(cfg Config) *admitter {
	a := cfg.Admission
	if !a.Enabled {
		return nil
	}
	lim := a.LimitsFor(kvroute.Replica{Model: cfg.Model})
	mif := a.MaxInFlightFor(cfg.Model)
	if lim.IsZero() && mif == 0 {
		return nil
	}
	return &admitter{
		cfg: a, limits: lim, maxInFlight: mif, ttl: a.TTLOrDefault(),
		queue: admission.NewQueue(a), room: make([]bool, cfg.Replicas),
	}
}

func (r *run) wall() time.Time { return epoch.Add(r.now) }

// admit routes request i at once when the queue is empty and a replica
// has room, and queues it otherwise.
func (r *run) admit(i int32) error {
	a := r.adm
	q := &r.w.Requests[i]
	st := &r.reqs[i]
	st.cost = r.cost(q)
	if a.queue.Len() == 0 && r.room() {
		a.inFlight++
		return r.route(i, a.room)
	}
	deadline := r.now + a.ttl
	ad := a.queue.Push(kvroute.Ticket{
		RequestID: strconv.Itoa(int(i)), Model: r.cfg.Model, Priority: q.Priority, Tenant: q.Tenant,
		Cost: st.cost, Deadline: epoch.Add(deadline),
	})
	if ad.Status == kvroute.Shed {
		st.shed = ad.Reason
		return nil
	}
	st.queued = true
	a.maxLen = max(a.maxLen, a.queue.Len())
	r.push(event{at: deadline + 1, kind: evExpire})
	r.dispatch()
	return r.err
}

// cost is a request's fairness charge as the service computes it when
// it queues: the prompt tokens its best candidate does not hold, plus its
// output tokens, at least 1.
func (r *run) cost(q *Request) int64 {
	uncached := max(q.PromptTokens-r.view.BestMatch(q.Keys)*r.bt, 0)
	return max(int64(uncached+q.OutputTokens), 1)
}

// room marks the replicas with room in r.adm.room and reports whether
// any has.
func (r *run) room() bool {
	a := r.adm
	full := a.maxInFlight > 0 && a.inFlight >= a.maxInFlight
	now := r.wall()
	any := false
	for p := range a.room {
		a.room[p] = !full && admission.HasRoom(r.replicaLoad(p), a.limits, r.bt, now, a.cfg.StaleAge(), a.cfg.StaleSaturated)
		any = any || a.room[p]
	}
	return any
}

// replicaLoad is replica p's load as admission reads it: the router
// view's bookings, and the engine's figures as a fresh scrape.
func (r *run) replicaLoad(p int) kvroute.Load {
	l := r.view.Load(p)
	e := &r.eng[p]
	return kvroute.Load{
		PrefillBlocks: int64(math.Round(l.Prefill)), DecodeBlocks: int64(math.Round(l.Decode)),
		Requests: int64(math.Round(l.Requests)),
		Waiting:  int64(len(e.waiting) - e.wHead), Running: int64(e.running),
		KVUsage:   float64(e.cache.pinned+e.anon) / float64(r.cfg.CapacityBlocks),
		ScrapedAt: r.wall(),
	}
}

// dispatch sheds the expired tickets, then pops and routes the queue's
// heads while some replica has room. An error (none is expected: a
// popped request always has a replica with room) is kept in r.err.
func (r *run) dispatch() {
	a := r.adm
	r.expire()
	for a.queue.Len() > 0 && r.room() {
		t, ok := a.queue.Pop(r.wall())
		if !ok {
			return
		}
		i, _ := strconv.Atoi(t.RequestID)
		a.inFlight++
		if err := r.route(int32(i), a.room); err != nil && r.err == nil {
			r.err = fmt.Errorf("sim: admitting request %d: %w", i, err)
		}
	}
}

// expire sheds every queued request past its deadline.
func (r *run) expire() {
	for _, t := range r.adm.queue.Expire(r.wall()) {
		i, _ := strconv.Atoi(t.RequestID)
		r.reqs[i].shed = kvroute.ShedTTL
	}
}
