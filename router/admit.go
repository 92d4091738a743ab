package router

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/scoring"
)

// Admission: a decision under admission books only a replica with room
// (Room, then the store checks again as it books); one that finds none
// queues in its model's queue in the store, shared by every pod, and
// waits here, holding its caller, until the queue grants it a seat
// (admitter, queue.go) or its wait runs out. The seat is then booked like
// any decision, over loads read afresh, so a queued request still goes
// where its prefix is cached when that replica has room.

// Queue is the store's admission queue (store/admit.go).
type Queue interface {
	// SetCapacity describes model's fleet to the queue: its routable
	// replicas and their limits.
	SetCapacity(ctx context.Context, model string, c kvroute.Capacity) error
	// Enqueue queues t and dispatches at once: Granted when a replica had
	// room, Queued with its position, or Shed with the reason.
	Enqueue(ctx context.Context, t kvroute.Ticket, hold time.Duration, lim kvroute.QueueLimits) (kvroute.Admission, error)
	// Dequeue takes a request out of the queue, or gives back the seat
	// granted to it: 1 dequeued, 2 seat given back, 0 neither.
	Dequeue(ctx context.Context, requestID string) (int, error)
	// Kick renews the hold of a pod's tickets, dispatches, and answers
	// the model's queue depth and each ticket's state.
	Kick(ctx context.Context, model string, hold time.Duration, ids []string) (int, []kvroute.TicketState, error)
	// Grants delivers the seats granted to pod's tickets until ctx ends.
	Grants(ctx context.Context, pod string) (<-chan kvroute.Grant, error)
}

// Room is admission's step of the decision core: it marks every candidate
// of in that has no room under its limits (lims[i], with loads[i] its load
// as read) unroutable, and returns how many routable candidates remain.
// With the fleet at cfg's MaxInFlightFor(in.Model), none has room. The
// service and the simulator both call it before Decide.
func Room(cfg admission.Config, in *Input, lims []kvroute.Limits, loads []kvroute.Load) int {
	var total int64
	for _, l := range loads {
		total += l.Requests
	}
	full := cfg.MaxInFlightFor(in.Model) > 0 && total >= cfg.MaxInFlightFor(in.Model)
	n := 0
	for i := range in.Candidates {
		c := &in.Candidates[i]
		if !c.Routable {
			continue
		}
		if full || !admission.HasRoom(loads[i], lims[i], in.BlockSize, in.Now, cfg.StaleAge(), cfg.StaleSaturated) {
			c.Routable = false
			continue
		}
		n++
	}
	return n
}

// Cost is the fairness charge of a request (kvroute.Ticket.Cost): the
// prompt tokens its best cached candidate has still to prefill, plus the
// output it is expected to write.
func Cost(cfg Config, in Input) int64 {
	best := 0
	for _, c := range in.Candidates {
		best = max(best, c.Overlap.Any)
	}
	uncached := max(in.PromptTokens-best*in.BlockSize, 0)
	out := in.MaxTokens
	if out <= 0 {
		out = cfg.MaxTokens
	}
	return max(int64(uncached+out), 1)
}

// coldCost is the charge of a request for a model with no replica: its
// whole prompt and its output.
func coldCost(cfg Config, req Request) int64 {
	out := req.MaxTokens
	if out <= 0 {
		out = cfg.MaxTokens
	}
	return max(int64(len(req.Tokens)+out), 1)
}

// admitInput applies Room to in, for the request's fleet (cands, with
// loads as read), after telling the store the model's capacity when this
// pod's view of it changed. For a request holding a seat on replica seat,
// the seat is its own and does not count against that replica; seatAt is
// the seat's candidate (-1: none). The ask is not nil when the request
// must queue: no candidate has room, or none is up at all.
func (r *Router) admitInput(ctx context.Context, req Request, in *Input, cands candidates, loads []kvroute.Load, seat string) (int, *queueAsk) {
	a := r.adm
	lims := make([]kvroute.Limits, len(cands.fleet))
	for i, rep := range cands.fleet {
		lims[i] = a.cfg.LimitsFor(cands.server(rep))
	}
	a.describe(ctx, r, in.Model, in.BlockSize, cands, lims)
	routable, seatAt := 0, -1
	for i, c := range in.Candidates {
		if c.Routable {
			routable++
		}
		if seat != "" && c.ID == seat {
			seatAt = i
		}
	}
	if routable == 0 {
		if seat == "" && a.mayColdStart(in.Model) {
			return -1, &queueAsk{id: in.RequestID, cost: coldCost(r.cfg, req), cold: true}
		}
		return seatAt, nil // every replica is unhealthy: the decision says so
	}
	cfg, view := a.cfg, loads
	if seatAt >= 0 {
		// The seat is this request's share of the fleet's max already.
		cfg.MaxInFlight, cfg.Models = 0, nil
		view = slices.Clone(loads)
		view[seatAt].Requests = max(view[seatAt].Requests-1, 0)
		in.Candidates[seatAt].Load = scoring.LoadOf(view[seatAt])
	}
	if Room(cfg, in, lims, view) > 0 {
		return seatAt, nil
	}
	if seatAt >= 0 {
		in.Candidates[seatAt].Routable = true
		return seatAt, nil
	}
	return -1, &queueAsk{id: in.RequestID, cost: Cost(r.cfg, *in)}
}

// bookSeat books the request on the candidate its seat is on (seatAt):
// the candidates with room filled between the loads read and the booking.
func (r *Router) bookSeat(ctx context.Context, in Input, seatAt int, tm *Stages) (Outcome, error) {
	o, err := DecideAs(r.cfg, in, seatAt)
	if err != nil {
		return Outcome{}, fmt.Errorf("router: %w", err)
	}
	booked, _, err := r.reserve(ctx, o, -1, nil, 0, tm)
	if err != nil {
		return Outcome{}, reserveErr(err)
	}
	if !booked {
		return Outcome{}, fmt.Errorf("router: book a seat: %w", kvroute.ErrNoRoom)
	}
	return o, nil
}

// describeModel tells the store model's capacity from a registry read:
// the beat's, for a model whose queued requests wait for replicas to come
// up.
func (r *Router) describeModel(ctx context.Context, model string) {
	replicas, read, err := r.replicas(ctx, model)
	if err != nil || read != fleetRead {
		return
	}
	fleet := modelFleet(replicas, model)
	cands := expand(fleet)
	lims := make([]kvroute.Limits, len(cands.fleet))
	for i, rep := range cands.fleet {
		lims[i] = r.adm.cfg.LimitsFor(cands.server(rep))
	}
	r.adm.describe(ctx, r, model, r.BlockSize(model, fleet), cands, lims)
}

// admitWith turns admission on over opt's queue.
func (r *Router) admitWith(opt Options) error {
	if err := r.cfg.Admission.Validate(); err != nil {
		return fmt.Errorf("router: %w", err)
	}
	q := opt.Queue
	if q == nil {
		var ok bool
		if q, ok = r.idx.(Queue); !ok {
			return errors.New("router: admission is enabled but the index is no queue")
		}
	}
	pod := opt.Pod
	if pod == "" {
		pod = randomID()
	}
	var a *admitter
	m, err := newAdmitMetrics(opt.MeterProvider, func() map[[3]string]int64 { return a.waiting() })
	if err != nil {
		return fmt.Errorf("router: admission metrics: %w", err)
	}
	a = newAdmitter(q, r.cfg.Admission, pod, r.log, r.now, m)
	a.refresh = r.describeModel
	r.adm = a
	return nil
}
