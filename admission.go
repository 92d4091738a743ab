package kvroute

import (
	"errors"
	"time"
)

// The types admission shares between the router, the store, the API and
// the simulator: what a replica may be given (Limits), a queued request's
// place (Ticket), and what the queue answers (Admission).

// ErrOverloaded is wrapped by every refusal to admit a request: the fleet
// is past its capacity and the request's queue, band or tenant is full,
// or it waited past its time to live.
var ErrOverloaded = errors.New("over capacity")

// ErrNoRoom is a booking under admission the store refused: no replica
// offered has room, or requests are queued before it. The request then
// queues.
var ErrNoRoom = errors.New("no replica has room")

// Limits bound what one replica is given before it counts as saturated.
// A zero field sets no limit. Requests and prefill tokens are what
// kvroute booked (always fresh); waiting and KV usage are what the
// engine's /metrics said at the last scrape.
type Limits struct {
	// MaxRequests bounds the requests booked on the replica and not yet
	// released (vLLM's --max-num-seqs is the natural value).
	MaxRequests int64 `json:"max_requests,omitempty"`
	// MaxPrefillTokens bounds the uncached prompt tokens booked on the
	// replica and not yet past their first token.
	MaxPrefillTokens int64 `json:"max_prefill_tokens,omitempty"`
	// MaxWaiting bounds the engine's vllm:num_requests_waiting.
	MaxWaiting int64 `json:"max_waiting,omitempty"`
	// MaxKVUsage bounds the engine's vllm:kv_cache_usage_perc (0 to 1).
	MaxKVUsage float64 `json:"max_kv_usage,omitempty"`
}

// IsZero reports whether l sets no limit.
func (l Limits) IsZero() bool { return l == Limits{} }

// Over returns l with every limit o sets replacing l's.
func (l Limits) Over(o Limits) Limits {
	if o.MaxRequests != 0 {
		l.MaxRequests = o.MaxRequests
	}
	if o.MaxPrefillTokens != 0 {
		l.MaxPrefillTokens = o.MaxPrefillTokens
	}
	if o.MaxWaiting != 0 {
		l.MaxWaiting = o.MaxWaiting
	}
	if o.MaxKVUsage != 0 {
		l.MaxKVUsage = o.MaxKVUsage
	}
	return l
}

// Ticket is a request's place in its model's admission queue.
type Ticket struct {
	RequestID string
	Model     string
	// Pod names the serving process that holds the request's connection
	// and is told when it is admitted.
	Pod string
	// Priority is the request's band: lower is served first, as vLLM
	// orders its priority field; bands are strictly ordered.
	Priority int
	// Tenant is whom the request's cost is charged to; tenants of one
	// band share it fairly.
	Tenant string
	// Cost is the fairness charge: the request's uncached prefill tokens
	// plus its expected output tokens, at least 1.
	Cost int64
	// Deadline is when the request is shed if it is still queued.
	Deadline time.Time
}

// AdmitStatus is what the queue did with a ticket.
type AdmitStatus int

const (
	// Queued: the ticket waits for capacity.
	Queued AdmitStatus = iota
	// Granted: capacity was set aside for it on Admission.Replica.
	Granted
	// Shed: refused, for Admission.Reason.
	Shed
)

// Why a request was shed (the reason an answer and a metric carry).
const (
	ShedQueueFull  = "queue_full"
	ShedBandFull   = "band_full"
	ShedTenantFull = "tenant_full"
	ShedTTL        = "ttl"
	ShedNoWait     = "no_wait"    // it would have queued and asked not to
	ShedNoReplica  = "no_replica" // none came up within the cold-start wait
	ShedPodLimit   = "pod_limit"  // the store is unreachable and this pod is at its share
)

// Admission is the queue's answer to a ticket.
type Admission struct {
	Status AdmitStatus
	// Replica is where capacity was set aside (Granted).
	Replica string
	// Position is how many queued requests are ahead of it in its band
	// and the bands before it (Queued), an estimate.
	Position int
	// Reason says why it was shed (Shed).
	Reason string
}

// Capacity describes a model's fleet to the queue: its routable replicas
// and what each may be given, and how to read them. The pods write it
// (the store's SetCapacity) whenever their view changes, so that a release run by
// any pod, or the ingestors' sweep, dispatches by the same limits.
type Capacity struct {
	// Replicas are the model's routable replicas and their limits.
	Replicas map[string]Limits
	// BlockSize turns a limit's prefill tokens into the blocks bookings
	// count (0: 16).
	BlockSize int
	// MaxInFlight bounds the requests booked on the whole fleet (0: none).
	MaxInFlight int64
	// StaleAfter is the age past which a scrape is stale; StaleSaturated
	// counts a stale replica as full instead of ignoring its scrape.
	StaleAfter     time.Duration
	StaleSaturated bool
	// GrantTTL is how long a seat granted to a queued request waits for
	// its booking before the sweep gives it back (0: 2 s).
	GrantTTL time.Duration
}

// QueueLimits bound one model's queue (0: none).
type QueueLimits struct {
	Queue, Band, Tenant int
	// FairShare bounds each tenant of a band, in place of Tenant, by
	// the band's limit divided among its backlogged tenants.
	FairShare bool
}

// TicketState is where a pod's ticket stands (the store's Kick).
type TicketState struct {
	// Queued: still waiting. Otherwise Replica names the seat granted to
	// it, or is empty when it is gone (expired, or already booked).
	Queued  bool
	Replica string
}

// A Grant tells a pod that its queued request was given a seat.
type Grant struct {
	RequestID, Replica string
	// At is the Redis time of the grant: capacity freed, request admitted.
	At time.Time
}
