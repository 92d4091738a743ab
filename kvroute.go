// Package kvroute holds the domain of a KV-cache-aware request router: the
// replicas it routes to, the block keys it indexes, the overlap and load it
// scores on, and the decisions it makes. Every type two packages share lives
// here, and this package depends on none of them, so that each can use these
// types without import cycles.
//
// Subpackages wrap one dependency each (store: Redis, ingestor: ZeroMQ, api:
// HTTP, tokenizer: tokenizer files) or one concern (scoring: the cost and
// policies; router: the decision flow, whose router.Decide is the one
// decision core the service and the simulator share; prompt: the front door
// from a request to token ids; sim: trace replay; vllmtest: a simulated vLLM
// replica for demos and tests). cmd/kvroute parses flags and internal/app
// wires the processes.
package kvroute

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// DefaultBlockSize is vLLM's CacheConfig.DEFAULT_BLOCK_SIZE. It is only a
// fallback: the block size a replica really uses is read from its events.
const DefaultBlockSize = 16

// Tier says where a cached block lives. Host-tier blocks must be copied back
// to the GPU before they help, so scoring credits them at a lower weight.
type Tier uint8

const (
	// TierGPU is the engine's own KV cache (vLLM medium "GPU" or nil).
	TierGPU Tier = iota
	// TierHost is any offloaded tier (vLLM medium "CPU", disk, remote).
	TierHost
)

// TierOf maps a vLLM event's medium to a tier. vLLM sends nil (empty here)
// or "GPU" for the engine cache; every other medium is an offload tier.
func TierOf(medium string) Tier {
	switch medium {
	case "", "GPU", "gpu", "cuda", "CUDA":
		return TierGPU
	}
	return TierHost
}

func (t Tier) String() string {
	if t == TierGPU {
		return "gpu"
	}
	return "host"
}

// Health is what the ingestor last learned about a replica. Routing excludes
// a replica the moment it is not healthy; its index entries survive a grace
// period so that a brief blip does not throw its cache away.
type Health string

const (
	HealthUnknown   Health = ""
	HealthHealthy   Health = "healthy"
	HealthUnhealthy Health = "unhealthy"
)

// Replica is one vLLM server. Events is its ZeroMQ PUB endpoint (empty for a
// replica that publishes no events: it is then routed on approximate entries
// only); Replay is its ROUTER endpoint for missed batches.
type Replica struct {
	ID     string            `json:"id"`
	Model  string            `json:"model"`
	URL    string            `json:"url"`
	Events string            `json:"events,omitempty"`
	Replay string            `json:"replay,omitempty"`
	Topic  string            `json:"topic,omitempty"`
	Labels map[string]string `json:"labels,omitempty"`
	Health Health            `json:"health,omitempty"`
	// Checked is when Health was last set; zero means never probed.
	Checked time.Time `json:"checked,omitzero"`
	// BlockSize is the tokens per KV block the replica reports (vLLM's
	// cache_config_info, scraped by the ingestor), 0 if unknown. Requests
	// must be keyed with the block size the replica's events are keyed
	// with, or no lookup ever matches; the replica knows it best.
	BlockSize int `json:"block_size,omitempty"`
	// FollowedSince is when an ingestor finished catching up on the
	// replica's event stream (its replay buffer applied); zero while no
	// ingestor follows it. Until then the index does not know what the
	// replica holds, and decisions for it say so.
	FollowedSince time.Time `json:"followed_since,omitzero"`
	// Source says how the replica was found: empty for one registered by
	// hand (PUT /v1/replicas, --replicas-file), else the discovery source
	// that wrote it ("dns:<name>", "k8s:<namespace>/<service>"). A source
	// updates and deletes only its own replicas, so that discovery never
	// removes what an operator registered.
	Source string `json:"source,omitempty"`
	// State is where the replica is in its lifecycle; empty is serving.
	State ReplicaState `json:"state,omitempty"`
	// StateSince is when State last changed (zero: never), from which a
	// gone replica's grace period runs.
	StateSince time.Time `json:"state_since,omitzero"`
	// DataParallelSize is how many data-parallel engines (vLLM's
	// --data-parallel-size) serve behind URL, each with its own KV cache
	// and its own event stream, their events and replay ports offset by
	// the rank as vLLM offsets them. 0 or 1: one engine.
	DataParallelSize int `json:"data_parallel_size,omitempty"`
	// PinIgnored is set, once and fleet-wide, when the served cached
	// tokens showed that the replica's engines ignore the
	// X-data-parallel-rank header (a vLLM without it, a server that
	// round-robins): its engines are then routed as one replica, their
	// caches merged, and no rank is named. Unset: ranks are pinned.
	PinIgnored bool `json:"data_parallel_pin_ignored,omitempty"`
	// Limits override, for this replica, the model's admission limits
	// (a GPU with more memory takes more); nil: the model's.
	Limits *Limits `json:"limits,omitempty"`
	// PriorityScheduling says the replica runs vLLM's
	// --scheduling-policy priority, so a request's priority field is
	// forwarded to it; otherwise the field is stripped (such a vLLM
	// refuses it with a 400). Set at registration, or learned from that
	// refusal.
	PriorityScheduling bool `json:"priority_scheduling,omitempty"`
}

// ReplicaState is a replica's place in its lifecycle, as its discovery
// source reports it (a hand-registered replica is always serving).
type ReplicaState string

const (
	// StateServing takes requests. It is the zero value.
	StateServing ReplicaState = ""
	// StateTerminating takes no new requests; those in flight finish (a
	// Kubernetes endpoint that is terminating, a pod draining).
	StateTerminating ReplicaState = "terminating"
	// StateGone vanished from its source: it takes nothing and is purged,
	// its bookings released, after a grace period, unless it returns.
	StateGone ReplicaState = "gone"
)

// String names the state, "serving" for the zero value, for answers and
// logs that must not show an empty string.
func (s ReplicaState) String() string {
	if s == StateServing {
		return "serving"
	}
	return string(s)
}

// MaxDataParallelSize bounds a replica's data-parallel engines; vLLM's
// deployments run a handful per node, and each one costs a follower.
const MaxDataParallelSize = 64

// Routable reports whether the replica may receive new traffic: serving,
// and not found unhealthy. A replica nobody has probed yet counts as
// routable: a fresh deployment without an ingestor must still work, and the
// first failed probe excludes it.
func (r Replica) Routable() bool {
	return r.Health != HealthUnhealthy && r.State == StateServing
}

// Validate checks what every writer of the registry must get right: the
// syntax and bounds of every field (validate.go). Where the addresses may
// point is AddressPolicy's to say; a writer applies both.
func (r Replica) Validate() error { return r.validate() }

// MaxBlockSize bounds a replica's reported block size: vLLM's are 1 to a
// few hundred tokens (the Mooncake trace's 512 is the largest seen), so
// anything far above is a misread, not a cache layout.
const MaxBlockSize = 1 << 16

func validID(s string) bool {
	if len(s) > MaxIDBytes {
		return false
	}
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}

// Overlap is how many leading blocks of a request one replica holds. The
// match stops at the first block the replica lacks: block d is useless to an
// engine that does not also hold blocks 0..d-1.
type Overlap struct {
	// GPU counts leading blocks held in the engine's own cache.
	GPU int `json:"gpu"`
	// Any counts leading blocks held in any tier (GPU or offloaded); Any >= GPU.
	Any int `json:"any"`
	// Approx counts leading blocks the router itself sent to this replica
	// recently; it stands in for replicas that publish no events.
	Approx int `json:"approx"`
	// Predicted counts leading blocks a live prediction says the replica
	// will hold once the prefill booked on it has run (PredictedOverlap);
	// Ready is that prediction's progress (0..1) and Wait the prefill
	// blocks still to run before it is held.
	Predicted int     `json:"predicted,omitempty"`
	Ready     float64 `json:"ready,omitempty"`
	Wait      float64 `json:"wait,omitempty"`
}

// Load is the work a replica already owes, in KV blocks, as every scoring pod
// sees it. Booked values come from router leases; Waiting, Running and
// KVUsage are scraped from the replica's /metrics and catch traffic that
// bypassed the router.
type Load struct {
	PrefillBlocks int64   `json:"prefill_blocks"`
	DecodeBlocks  int64   `json:"decode_blocks"`
	Requests      int64   `json:"requests"`
	Waiting       int64   `json:"waiting,omitempty"`
	Running       int64   `json:"running,omitempty"`
	KVUsage       float64 `json:"kv_usage,omitempty"`
	// ScrapedAt is when Waiting, Running and KVUsage were scraped (zero:
	// never), so that admission can tell a stale scrape.
	ScrapedAt time.Time `json:"-"`
	// Version changes on every booking on the replica. A decision books only
	// if the version it scored on is still current, so that a burst of
	// simultaneous decisions from many pods spreads instead of herding.
	Version int64 `json:"-"`
}

// Lease is the load one decision booked. It expires on its own so that a
// scoring pod that dies mid-request cannot leak load.
type Lease struct {
	RequestID     string    `json:"request_id"`
	Model         string    `json:"model"`
	Replica       string    `json:"replica"`
	PrefillBlocks int64     `json:"prefill_blocks"`
	DecodeBlocks  int64     `json:"decode_blocks"`
	Expires       time.Time `json:"expires"`
	// Admit puts the booking under admission: it is made only on a
	// replica with room and only when no request is queued before it,
	// unless the request holds a seat the queue granted it, which the
	// booking then takes. Otherwise the store answers ErrNoRoom. False:
	// booked wherever the decision says, as before admission.
	Admit bool `json:"-"`
	// Predict, when not nil, also records on the booked replica that it
	// will hold the prompt's chain (prediction.go), in the same atomic
	// step; nil predicts nothing.
	Predict *PredictPlan `json:"-"`
}

// A Choice is one replica a contested booking may land on: the lease's
// prefill if booked there, and the overlap credit its cost subtracts.
type Choice struct {
	Replica       string
	PrefillBlocks int64
	// Credit is the prefill blocks the replica's cached prefix is worth
	// in its cost (the overlap credit times the blocks it matched).
	Credit float64
	// Floor is the least the prefill term can be there, whatever the
	// credit: the request's own prefill owed, plus the part of an
	// in-flight prefill it would wait for that computes nothing it needs.
	Floor float64
	// Held is the leading blocks the replica holds, in GPU-block units
	// (events, or approximate entries), as scored: a predicted entry the
	// store finds there when it books, written since the decision's
	// lookup, is credited beyond them (ChoiceCost.PredictWeight).
	Held float64
}

// ChoiceCost is the cost a store evaluates to book the cheapest of
// several Choices at their loads as they are at that moment (the router's
// kv cost): with P, D and N a choice's booked prefill, decode and
// requests (N at least its scraped running plus waiting),
//
//	PrefillScale × max(Floor, P + Blocks − Credit) + (D + Active) + RequestWeight × N
//
// The cheapest by more than Eps wins, then the least loaded (P + D) by
// more than Eps, then the earliest choice. Bound is the cost the winner
// must stay under by Eps (the cheapest replica left out of the choices,
// as last read); nothing is booked otherwise. scoring.Settle builds it
// and scoring.Settled evaluates it in Go.
type ChoiceCost struct {
	PrefillScale, RequestWeight float64
	Blocks, Active              float64
	Bound, Eps                  float64
	// OverlapCredit and PredictWeight price a predicted entry the store
	// finds on a choice when it books (written by a booking since the
	// decision's lookup: a burst's decisions all looked up before any
	// booked), as scoring prices one a lookup found; PredictWeight 0 (or
	// a lease that predicts nothing) finds none.
	OverlapCredit, PredictWeight float64
}

// OpKind is the kind of one index operation.
type OpKind uint8

const (
	// OpStore adds one reference to (replica, Key, Tier).
	OpStore OpKind = iota + 1
	// OpRemove drops one reference to the block the replica knows by EngineHash.
	OpRemove
	// OpClear forgets everything the replica holds.
	OpClear
)

// IndexOp is one change to a replica's entries, translated from an engine
// event. The store never sees engine events, only these.
type IndexOp struct {
	Kind OpKind
	// EngineHash is the replica's own hash of the block; removals arrive
	// under it and the store maps it back to Key.
	EngineHash uint64
	// Key is the router's key of the block (OpStore only).
	Key BlockKey
	// Parent is the router key of the block before Key, or NoParent when Key
	// is the first block of a prompt (OpStore only).
	Parent BlockKey
	Tier   Tier
}

// Sentinel errors, mapped to HTTP status in one place in api.
var (
	ErrNotFound     = errors.New("not found")
	ErrNoReplica    = errors.New("no routable replica")
	ErrUnavailable  = errors.New("state store unavailable")
	ErrInvalidInput = errors.New("invalid input")
	// ErrFenced is a write to a replica's index by a writer that is not
	// the one the store holds for it: another ingestor took the replica
	// over, and only one may write it, or a reset of one would wipe what
	// the other applied.
	ErrFenced = errors.New("another writer holds the replica")
	// ErrStoreBehind is a run whose first batch does not follow the
	// replica's applied seq in the store, which is older: the store lost
	// batches it had acknowledged (a Cluster failover to a replica that
	// had not received them, an AOF that lost its last second). Nothing
	// was applied; the follower must replay from the store's seq.
	ErrStoreBehind = errors.New("the store lost applied batches")
)

// FieldError is bad input attributable to one request field; api turns it
// into a 400 whose body names the field.
type FieldError struct {
	Field string
	Msg   string
}

func (e *FieldError) Error() string { return fmt.Sprintf("%s %s", e.Field, e.Msg) }

// Unwrap lets callers test errors.Is(err, ErrInvalidInput).
func (e *FieldError) Unwrap() error { return ErrInvalidInput }

// ApplyResult says what applying one run of a replica's event batches did to
// the index. Applied is false when the run's seqs were not newer than the
// replica's applied seq and nothing changed (a replay overlapping what
// another ingestor already applied).
type ApplyResult struct {
	Applied bool
	// NoPrior is set when the run was applied to a replica the store held
	// no applied seq for: its first run ever, a run after a reset, or one
	// after the store lost the replica's entries (a Cluster shard that came
	// back empty, a purge by another process). A follower that had applied
	// the stream before takes it for the last: what came before the run is
	// gone from the index, and only a replay can bring it back.
	NoPrior bool
	Stored  int
	Removed int
	// Unknown counts removals of blocks the replica was not known to hold
	// (an engine hash never stored, or a tier with no reference left).
	Unknown int
}

// ReplicaStats is the index's view of one replica: how many blocks it holds
// and how far its event stream has been applied. The store fills it; the
// admin API shows it.
type ReplicaStats struct {
	// Blocks is the number of distinct blocks held (any tier).
	Blocks     int
	AppliedSeq int64
	// HasSeq is false until the first batch is applied: AppliedSeq 0 is a
	// real seq.
	HasSeq      bool
	LastApplied time.Time
}

// TokenizeRequest asks what token ids an engine computes for a prompt: a
// text prompt (Prompt) or a chat conversation (Messages and its options),
// with the field names and defaults of vLLM's OpenAI server. The front
// door builds it; a local tokenizer or a replica's own tokenization
// endpoint answers it.
type TokenizeRequest struct {
	Model string
	// Prompt is a text prompt; nil for chat.
	Prompt *string
	// Messages is the chat's "messages" array as sent; Tools, Documents
	// and ChatTemplateKwargs its options of those names.
	Messages           json.RawMessage
	Tools              json.RawMessage
	Documents          json.RawMessage
	ChatTemplateKwargs json.RawMessage
	// AddGenerationPrompt nil means vLLM's default, true.
	AddGenerationPrompt  *bool
	ContinueFinalMessage bool
	// ReasoningEffort is the chat's "reasoning_effort"; some templates
	// render it. Empty means unset.
	ReasoningEffort string
	// AddSpecialTokens nil means vLLM's default: true for a text prompt,
	// false for chat (the template writes BOS itself).
	AddSpecialTokens *bool
}

// Chat reports whether the request is a chat conversation.
func (r TokenizeRequest) Chat() bool { return r.Prompt == nil }

// SpecialTokens is AddSpecialTokens with vLLM's default applied.
func (r TokenizeRequest) SpecialTokens() bool {
	if r.AddSpecialTokens != nil {
		return *r.AddSpecialTokens
	}
	return !r.Chat()
}
