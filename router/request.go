package router

// The routing question and its answer: what a caller asks (Request, checked
// once here) and what it gets back (Decision), with the typed errors the
// api maps to HTTP statuses.

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scoring"
)

// Request is one routing question.
type Request struct {
	Model     string
	Tokens    []uint32
	SessionID string
	CacheSalt string
	LoRA      string
	MaxTokens int
	// Policy overrides the configured policy for this request.
	Policy scoring.Policy
	// Priority is the request's admission band: lower is admitted first,
	// as vLLM orders its priority field. 0 is the default band.
	Priority int
	// Tenant is whom the request's cost is charged to when it queues
	// (empty: the anonymous tenant, "").
	Tenant string
	// MaxWait bounds how long the request may wait in its model's queue
	// when no replica has room: 0 does not wait (it is shed at once,
	// kvroute.ShedNoWait, with its queue position), negative waits up to
	// the queue's TTL.
	MaxWait time.Duration
}

// Check refuses a request the router cannot answer: no model, or a policy
// override that is not a policy. Route calls it first; the API calls it
// before it resolves the prompt, so that a request naming no model is not
// tokenized first. It is the one place these two fields are validated.
func (req Request) Check() error {
	if req.Model == "" {
		return &RequestError{Field: "model", Msg: "is required"}
	}
	if req.Policy != "" {
		if _, err := scoring.ParsePolicy(string(req.Policy)); err != nil {
			return &RequestError{Field: "policy", Msg: err.Error()}
		}
	}
	return nil
}

// RequestError is a request Check refuses, naming the request field at
// fault, so that the API can point a client at it.
type RequestError struct {
	Field string
	Msg   string
}

func (e *RequestError) Error() string { return e.Field + " " + e.Msg }

// Unwrap lets callers test errors.Is(err, kvroute.ErrInvalidInput).
func (e *RequestError) Unwrap() error { return kvroute.ErrInvalidInput }

// ModelNotFoundError is a request for a model no replica serves. It is
// typed because to a client it is a different mistake from an unknown
// request or replica id, which are kvroute.ErrNotFound as well.
type ModelNotFoundError struct {
	Model string
}

func (e *ModelNotFoundError) Error() string {
	return fmt.Sprintf("router: model %q: %v", e.Model, kvroute.ErrNotFound)
}

// Unwrap lets callers test errors.Is(err, kvroute.ErrNotFound).
func (e *ModelNotFoundError) Unwrap() error { return kvroute.ErrNotFound }

// ShedError is a request admission refused: the fleet is past its
// capacity and the request could not wait (Reason is one of kvroute's
// Shed* reasons), or its model has no replica within the cold-start wait.
type ShedError struct {
	Model  string
	Reason string
	// RetryAfter is when a retry may be admitted, an estimate (at least
	// a second).
	RetryAfter time.Duration
	// Position is how many requests were queued ahead of it.
	Position int
}

func (e *ShedError) Error() string {
	if e.Reason == kvroute.ShedNoReplica {
		return fmt.Sprintf("router: model %q: no replica came up within the cold-start wait", e.Model)
	}
	return fmt.Sprintf("router: model %q: shed (%s)", e.Model, e.Reason)
}

// Unwrap is kvroute.ErrNoReplica for a model with no replica, else
// kvroute.ErrOverloaded.
func (e *ShedError) Unwrap() error {
	if e.Reason == kvroute.ShedNoReplica {
		return kvroute.ErrNoReplica
	}
	return kvroute.ErrOverloaded
}

// Decision is the answer, with everything explain needs.
type Decision struct {
	RequestID    string
	Replica      kvroute.Replica
	Matched      int
	Approximate  bool
	PromptBlocks int
	BlockSize    int
	Policy       scoring.Policy
	Mode         string
	Degraded     bool
	Reason       string
	Candidates   []scoring.Score
	Expires      time.Time
	// Stages is how long each step of the decision took.
	Stages Stages
	// IndexIncomplete is true when the chosen replica publishes events but
	// no ingestor has caught up on them yet (a replica just registered, or
	// one whose ingestor died): what the index says it holds may be short.
	IndexIncomplete bool
	// Pinned is true when Replica is data-parallel and the decision chose
	// one of its engines, DataParallelRank, which the request must name
	// in vLLM's X-data-parallel-rank header; Candidates then name engines
	// (kvroute.EngineID). False: the server picks its engine.
	Pinned           bool
	DataParallelRank int
	// Queued is how long the request waited for admission (0: admitted
	// at once).
	Queued time.Duration
	// PredictedBlocks is the leading blocks a predicted entry says the
	// chosen replica will hold once the prefill booked there has run,
	// when its cost counted them (0: none). PredictionCounted says some
	// candidate's cost counted a prediction, PredictionChanged that the
	// pick would not have been among the cheapest without them.
	PredictedBlocks                      int
	PredictionCounted, PredictionChanged bool
}
