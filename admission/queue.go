package admission

import (
	"container/heap"
	"slices"
	"time"

	"github.com/kvroute/kvroute"
)

// Queue is one model's admission queue, in memory: the reference
// implementation of the dispatch order every kvroute queue follows (the
// store's Lua queue is held equal to it by a randomized test), and the
// simulator's queue. It is pure and deterministic: the same calls in the
// same order give the same answers, whatever the map iteration order.
//
// The order, exactly:
//
//   - Bands: the lowest Priority with any queued ticket is served first,
//     strictly (a lower band never waits for a higher one).
//   - Within a band, start-time fair queuing between tenants, charged
//     each ticket's Cost (at least 1). The band has a virtual time V
//     (starts at 0) and every (band, tenant) a finish tag F (starts at 0);
//     both are integers and are kept for the Queue's life, even while the
//     band or tenant has nothing queued.
//   - Push: a tenant with no ticket queued in the band first sets
//     F = max(F, V), so that a tenant returning from idle banks no credit
//     for the time it was away; the ticket joins the tenant's FIFO.
//   - Pop: the backlogged tenant with the least F, ties broken by tenant
//     name, bytewise ascending (the empty name sorts first); its oldest
//     ticket (push order) leaves; then V = F and F += max(Cost, 1).
//   - Remove (and expiry): the ticket leaves; F and V do not change.
//   - Limits, checked at Push in this order: the model's queued count at
//     QueueMax sheds ShedQueueFull, the band's at BandMax ShedBandFull,
//     the tenant's in the band at TenantMax ShedTenantFull (a max of 0 is
//     no limit). Position is the tickets queued in bands of priority at
//     most the ticket's own, counted before it is added.
//   - Expiry: a ticket is shed (ShedTTL) once now > Deadline; a zero
//     Deadline is the zero time, so such a ticket expires at the first
//     Pop or Expire: callers always set one.
//
// A Queue is not safe for concurrent use.
type Queue struct {
	cfg   Config
	bands map[int]*band
	prios []int // every band ever used, ascending
	byID  map[string]*entry
	dl    deadlines
	n     int
	seq   uint64
}

type band struct {
	prio    int
	v       int64
	n       int
	tenants map[string]*tenant
}

type tenant struct {
	name string
	f    int64
	n    int      // live tickets
	fifo []*entry // push order; removed entries are skipped lazily
	head int
}

type entry struct {
	t       kvroute.Ticket
	seq     uint64
	band    *band
	tenant  *tenant
	removed bool
}

// NewQueue returns an empty queue under cfg's queue limits (QueueMax,
// BandMax, TenantMax); the rest of cfg is not used.
func NewQueue(cfg Config) *Queue {
	return &Queue{cfg: cfg, bands: make(map[int]*band), byID: make(map[string]*entry)}
}

// Push queues t, or sheds it when a limit is reached (see Queue for the
// order of the checks). A RequestID already queued is not added twice: the
// answer is Queued with the Position it would have if pushed now, so that
// a retried push is harmless.
func (q *Queue) Push(t kvroute.Ticket) kvroute.Admission {
	pos := q.ahead(t.Priority)
	if e, ok := q.byID[t.RequestID]; ok && !e.removed {
		return kvroute.Admission{Status: kvroute.Queued, Position: pos - 1}
	}
	b := q.bands[t.Priority]
	var ten *tenant
	if b != nil {
		ten = b.tenants[t.Tenant]
	}
	switch {
	case q.cfg.QueueMax() > 0 && q.n >= q.cfg.QueueMax():
		return kvroute.Admission{Status: kvroute.Shed, Reason: kvroute.ShedQueueFull, Position: pos}
	case q.cfg.BandMax() > 0 && b != nil && b.n >= q.cfg.BandMax():
		return kvroute.Admission{Status: kvroute.Shed, Reason: kvroute.ShedBandFull, Position: pos}
	case b != nil && q.tenantMax(b, ten) > 0 && ten != nil && ten.n >= q.tenantMax(b, ten):
		return kvroute.Admission{Status: kvroute.Shed, Reason: kvroute.ShedTenantFull, Position: pos}
	}
	if b == nil {
		b = &band{prio: t.Priority, tenants: make(map[string]*tenant)}
		q.bands[t.Priority] = b
		i, _ := slices.BinarySearch(q.prios, t.Priority)
		q.prios = slices.Insert(q.prios, i, t.Priority)
	}
	if ten == nil {
		ten = &tenant{name: t.Tenant}
		b.tenants[t.Tenant] = ten
	}
	if ten.n == 0 {
		ten.f = max(ten.f, b.v)
		ten.fifo, ten.head = ten.fifo[:0], 0
	}
	q.seq++
	e := &entry{t: t, seq: q.seq, band: b, tenant: ten}
	ten.fifo = append(ten.fifo, e)
	ten.n++
	b.n++
	q.n++
	q.byID[t.RequestID] = e
	heap.Push(&q.dl, e)
	return kvroute.Admission{Status: kvroute.Queued, Position: pos}
}

// tenantMax is how many tickets ten may hold in band b: the fixed limit,
// or its fair share (ShareOf) of the band with the other tenants
// backlogged in it.
func (q *Queue) tenantMax(b *band, ten *tenant) int {
	if !q.cfg.FairShare() {
		return q.cfg.TenantMax()
	}
	others := 0
	for _, t := range b.tenants {
		if t.n > 0 && t != ten {
			others++
		}
	}
	return ShareOf(q.cfg.BandMax(), others)
}

// ahead counts the tickets queued in bands of priority at most prio.
func (q *Queue) ahead(prio int) int {
	n := 0
	for _, p := range q.prios {
		if p > prio {
			break
		}
		n += q.bands[p].n
	}
	return n
}

// Pop sheds every ticket expired at now (as Expire, whose answer it
// drops: call Expire first to learn them) and hands out the next ticket in
// the dispatch order. It reports false when nothing is queued.
func (q *Queue) Pop(now time.Time) (kvroute.Ticket, bool) {
	q.Expire(now)
	for _, p := range q.prios {
		b := q.bands[p]
		if b.n == 0 {
			continue
		}
		var best *tenant
		for _, ten := range b.tenants {
			if ten.n > 0 && (best == nil || ten.f < best.f || ten.f == best.f && ten.name < best.name) {
				best = ten
			}
		}
		e := best.next()
		b.v = best.f
		best.f += max(e.t.Cost, 1)
		q.drop(e)
		return e.t, true
	}
	return kvroute.Ticket{}, false
}

// next is the tenant's oldest live ticket; the tenant must have one.
func (t *tenant) next() *entry {
	for t.fifo[t.head].removed {
		t.head++
	}
	return t.fifo[t.head]
}

// drop takes e out of every count; its FIFO slot and deadline entry are
// skipped lazily.
func (q *Queue) drop(e *entry) {
	e.removed = true
	e.tenant.n--
	e.band.n--
	q.n--
	delete(q.byID, e.t.RequestID)
	if e.tenant.n == 0 {
		clear(e.tenant.fifo)
		e.tenant.fifo, e.tenant.head = e.tenant.fifo[:0], 0
	}
	if len(q.dl) > 2*q.n+64 {
		q.dl = slices.DeleteFunc(q.dl, func(x *entry) bool { return x.removed })
		heap.Init(&q.dl)
	}
}

// Expire sheds every ticket with now > Deadline and returns them, the
// earliest deadline first and, among equal deadlines, in push order.
func (q *Queue) Expire(now time.Time) []kvroute.Ticket {
	var out []kvroute.Ticket
	for len(q.dl) > 0 {
		e := q.dl[0]
		if !e.removed && !now.After(e.t.Deadline) {
			break
		}
		heap.Pop(&q.dl)
		if !e.removed {
			q.drop(e)
			out = append(out, e.t)
		}
	}
	return out
}

// Remove takes the queued ticket of request id out (its client left);
// finish tags and virtual times are unchanged. It reports whether the
// ticket was queued.
func (q *Queue) Remove(id string) bool {
	e, ok := q.byID[id]
	if !ok {
		return false
	}
	q.drop(e)
	return true
}

// Len is the number of tickets queued.
func (q *Queue) Len() int { return q.n }

// BandLen is the number of tickets queued in band prio.
func (q *Queue) BandLen(prio int) int {
	if b := q.bands[prio]; b != nil {
		return b.n
	}
	return 0
}

// TenantLen is the number of tenant's tickets queued in band prio.
func (q *Queue) TenantLen(prio int, tenant string) int {
	if b := q.bands[prio]; b != nil {
		if t := b.tenants[tenant]; t != nil {
			return t.n
		}
	}
	return 0
}

// Bands lists the priorities with a ticket queued, ascending.
func (q *Queue) Bands() []int {
	var out []int
	for _, p := range q.prios {
		if q.bands[p].n > 0 {
			out = append(out, p)
		}
	}
	return out
}

// Finish is tenant's finish tag F in band prio and the band's virtual
// time V (0 for a band or tenant never seen): the fair-queuing state the
// store's queue is compared on.
func (q *Queue) Finish(prio int, tenant string) (f, v int64) {
	b := q.bands[prio]
	if b == nil {
		return 0, 0
	}
	if t := b.tenants[tenant]; t != nil {
		f = t.f
	}
	return f, b.v
}

// deadlines is a min-heap of entries by (Deadline, push order).
type deadlines []*entry

func (h deadlines) Len() int { return len(h) }
func (h deadlines) Less(i, j int) bool {
	if !h[i].t.Deadline.Equal(h[j].t.Deadline) {
		return h[i].t.Deadline.Before(h[j].t.Deadline)
	}
	return h[i].seq < h[j].seq
}
func (h deadlines) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *deadlines) Push(x any)   { *h = append(*h, x.(*entry)) }
func (h *deadlines) Pop() any {
	old := *h
	x := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return x
}
