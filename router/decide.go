package router

import (
	"fmt"
	"math"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scoring"
)

// DecodeBooking says what a decision books as the request's decode work.
type DecodeBooking string

const (
	// BookOutput books the output still owed (expected output blocks): the
	// work the replica owes, and what the service books by default.
	BookOutput DecodeBooking = "output"
	// BookActive books the KV the request holds while it runs (prompt
	// plus output blocks), Dynamo's "active blocks". The simulator keeps
	// it for comparison: counted that way one decoding request outweighs
	// a whole prompt's cache hit.
	BookActive DecodeBooking = "active"
)

// MaxLease bounds the life of any booking, whatever a request's numbers
// predict: a lease outliving its request only keeps phantom load on a
// replica.
const MaxLease = time.Hour

// Candidate is one replica of the request's model as a decision sees it:
// what the index says it holds of the prompt and what it already owes.
type Candidate struct {
	ID       string
	Routable bool
	// Events is true for a replica that publishes KV-cache events. One
	// that publishes none is known only from what decisions sent it, so
	// a decision for it asks the caller to record approximate entries.
	Events  bool
	Overlap kvroute.Overlap
	Load    scoring.Load
}

// Input is everything one decision depends on. Decide reads nothing else:
// the service fills it from the store, the simulator from its model of the
// router's view, and both get the same answer for the same Input.
type Input struct {
	RequestID string
	Model     string
	// Blocks is the number of full prompt blocks keyed (the overlaps are
	// counted in these); PromptTokens the prompt's length in tokens.
	Blocks int
	// Keys are the prompt's block keys (len(Keys) == Blocks), from which
	// the booking's predicted entry is made; nil predicts nothing.
	Keys         []kvroute.BlockKey
	PromptTokens int
	BlockSize    int
	// MaxTokens is the request's output limit; 0 or less means the
	// client gave none and Config.MaxTokens is assumed.
	MaxTokens int
	SessionID string
	// Policy overrides Config.Scoring.Policy when not empty.
	Policy scoring.Policy
	// Counter drives round-robin; the caller keeps it.
	Counter    uint64
	Now        time.Time
	Candidates []Candidate
}

// Outcome is a decision: the pick, what to book for it, and what explain
// shows.
type Outcome struct {
	// Pick indexes Input.Candidates.
	Pick   int
	Result scoring.Result
	// Matched is the leading blocks the pick is believed to hold, from
	// events or, when those say less, from approximate entries
	// (Approximate is then true).
	Matched     int
	Approximate bool
	// Lease is the load to book on the pick: the prefill left after the
	// credited overlap, the decode booking, and an expiry.
	Lease kvroute.Lease
	// RecordApprox asks the caller to remember that the pick was sent the
	// prompt's blocks (it publishes no events).
	RecordApprox bool
	// Predicted says some candidate's cost counted a predicted entry, and
	// PredictionChanged that without predictions the pick would not have
	// been among the cheapest (the decisions predictions changed).
	Predicted, PredictionChanged bool
}

// Decide makes one decision. It is pure: the same cfg, in and random
// sequence give the same Outcome, which is what lets the simulator stand
// for the service. The only error is scoring's (no routable candidate, an
// unknown policy).
func Decide(cfg Config, in Input, rng scoring.Rand) (Outcome, error) {
	sc, sreq, cands, maxTokens, decode := scoringInput(cfg, in)
	res, err := scoring.Pick(sc, sreq, cands, rng)
	if err != nil {
		return Outcome{Result: res}, err
	}
	out := outcome(cfg, in, res, maxTokens, decode)
	out.Predicted, out.PredictionChanged = predictionChanged(sc, sreq, cands, res)
	return out, nil
}

// predictionChanged reports whether any candidate's cost in res counted a
// prediction (credited more blocks than it holds) and, if so, whether the
// pick would not be among the cheapest without them.
func predictionChanged(sc scoring.Config, req scoring.Request, cands []scoring.Candidate, res scoring.Result) (predicted, changed bool) {
	for _, s := range res.Scores {
		if s.Matched > s.Held {
			sc.PredictWeight = 0
			return true, !scoring.Cheapest(sc, req, cands, res.Pick)
		}
	}
	return false, false
}

// DecideAs is the Outcome of booking candidate p, scored as Decide scores
// (ties broken by order): what a decision answers when the store settled
// a contested booking on another candidate than the one it picked. It is
// pure.
func DecideAs(cfg Config, in Input, p int) (Outcome, error) {
	sc, sreq, cands, maxTokens, decode := scoringInput(cfg, in)
	res, err := scoring.Pick(sc, sreq, cands, nil)
	if err != nil {
		return Outcome{Result: res}, err
	}
	if p < 0 || p >= len(cands) || !cands[p].Routable {
		return Outcome{Result: res}, fmt.Errorf("router: candidate %d is not routable", p)
	}
	res.Pick = p
	return outcome(cfg, in, res, maxTokens, decode), nil
}

// outcome completes a decision on res's pick: the lease to book, the
// match it answers with, the approximate record.
func outcome(cfg Config, in Input, res scoring.Result, maxTokens int, decode int64) Outcome {
	p := res.Pick
	s := res.Scores[p]
	out := Outcome{Pick: p, Result: res, Matched: max(s.GPU, s.Any)}
	if s.Approx > out.Matched {
		out.Matched, out.Approximate = s.Approx, true
	}
	// The prefill still owed is what the cost function credited, as a
	// booking the store settles owes it.
	prefill := s.Owed
	out.Lease = kvroute.Lease{
		RequestID: in.RequestID, Model: in.Model, Replica: in.Candidates[p].ID,
		PrefillBlocks: prefill, DecodeBlocks: decode,
		Expires: in.Now.Add(LeaseTTL(cfg, in.PromptTokens, maxTokens)),
	}
	out.RecordApprox = !in.Candidates[p].Events && in.Blocks > 0
	out.Lease.Predict = predictPlan(cfg, in, p, s.Held)
	return out
}

// DefaultPredictGrace is Config.PredictGrace's zero value: how long a
// predicted entry waits past its due time for the event that confirms it.
// vLLM publishes a step's events as the step ends; 2 s covers that and an
// ingestor's batching with room to spare.
const DefaultPredictGrace = 2 * time.Second

// predictPlan is the predicted entry a booking on candidate p records:
// the prompt's chain, due when the replica's booked prefill has run at
// cfg's conservative prefill speed. None when predictions are off, the
// replica publishes no events (approximate entries stand in for those),
// the prompt has no full block, or the replica already holds all but
// fewer than kvroute.MinPredictBlocks of it (held, in GPU-block units).
func predictPlan(cfg Config, in Input, p int, held float64) *kvroute.PredictPlan {
	if cfg.Scoring.PredictWeight == 0 || !in.Candidates[p].Events || len(in.Keys) == 0 || len(in.Keys) != in.Blocks {
		return nil
	}
	if float64(in.Blocks)-held < kvroute.MinPredictBlocks {
		return nil
	}
	plan := &kvroute.PredictPlan{Marks: kvroute.PredictMarks(in.Keys), Grace: cfg.PredictGrace}
	if plan.Grace <= 0 {
		plan.Grace = DefaultPredictGrace
	}
	if cfg.PrefillTPS > 0 && in.BlockSize > 0 {
		plan.PerBlock = time.Duration(float64(in.BlockSize) / cfg.PrefillTPS * float64(time.Second))
	}
	return plan
}

// scoringInput is what scoring sees of a decision's input, and the
// output-token count and decode booking Decide derives from it.
func scoringInput(cfg Config, in Input) (scoring.Config, scoring.Request, []scoring.Candidate, int, int64) {
	sc := scoringConfig(cfg, in)
	maxTokens := in.MaxTokens
	if maxTokens <= 0 {
		maxTokens = cfg.MaxTokens
	}
	decode := OutputBlocks(maxTokens, in.BlockSize)
	if cfg.DecodeBooking == BookActive {
		decode += int64(in.Blocks)
	}
	cands := make([]scoring.Candidate, len(in.Candidates))
	for i, c := range in.Candidates {
		cands[i] = scoring.Candidate{
			ID: c.ID, Routable: c.Routable, GPU: c.Overlap.GPU, Any: c.Overlap.Any, Approx: c.Overlap.Approx,
			Predicted: c.Overlap.Predicted, Ready: c.Overlap.Ready, Wait: c.Overlap.Wait, Load: c.Load,
		}
	}
	sreq := scoring.Request{Blocks: in.Blocks, ActiveBlocks: float64(decode), SessionID: in.SessionID, Counter: in.Counter}
	return sc, sreq, cands, maxTokens, decode
}

// scoringConfig is the scoring configuration a decision is made under: the
// router's, with the request's policy when it names one.
func scoringConfig(cfg Config, in Input) scoring.Config {
	sc := cfg.Scoring
	if in.Policy != "" {
		sc.Policy = in.Policy
	}
	return sc
}

// MaxSlack bounds Slack's answer.
const MaxSlack = 8

// Slack is how many more bookings like out's its pick can take (each
// adding the lease's prefill and decode and one request to its load, the
// others' loads as in) and still win on load alone (scoring.Keeps), up to
// MaxSlack; 0 when it would not, or when the policy is not a cost policy.
// A decision that lost a booking race books its pick again only while the
// pick's load is within that many bookings of what it scored: exactly the
// loads at which the same decision made later, in sequence, would pick it
// too. It is pure.
func Slack(cfg Config, in Input, out Outcome) int {
	sc, sreq, cands, _, _ := scoringInput(cfg, in)
	p := out.Pick
	if p < 0 || p >= len(cands) {
		return 0
	}
	base := cands[p].Load
	keeps := func(k int) bool {
		cands[p].Load = scoring.Load{
			Prefill:  base.Prefill + float64(k)*float64(out.Lease.PrefillBlocks),
			Decode:   base.Decode + float64(k)*float64(out.Lease.DecodeBlocks),
			Requests: base.Requests + float64(k),
		}
		return scoring.Keeps(sc, sreq, cands, p)
	}
	// Costs grow with the pick's load, so the bookings it keeps through
	// are a prefix: search for its end.
	if !keeps(1) {
		return 0
	}
	if keeps(MaxSlack) {
		return MaxSlack
	}
	lo, hi := 1, MaxSlack // keeps(lo), not keeps(hi)
	for hi-lo > 1 {
		mid := (lo + hi) / 2
		if keeps(mid) {
			lo = mid
		} else {
			hi = mid
		}
	}
	return lo
}

// OutputBlocks is the decode work a request owes in blocks: its output
// tokens rounded up to whole blocks. It does not overflow on any int.
func OutputBlocks(tokens, blockSize int) int64 {
	if tokens <= 0 || blockSize <= 0 {
		return 0
	}
	n := int64(tokens / blockSize)
	if tokens%blockSize != 0 {
		n++
	}
	return n
}

// LeaseTTL is how long a booking may live: the configured minimum plus the
// request's predicted duration at conservative engine speeds, capped at
// MaxLease. The arithmetic is done in float seconds and capped before it
// becomes a Duration, so no request's numbers can overflow it.
func LeaseTTL(cfg Config, promptTokens, maxTokens int) time.Duration {
	secs := cfg.LeaseTTL.Seconds()
	if cfg.PrefillTPS > 0 {
		secs += float64(max(promptTokens, 0)) / cfg.PrefillTPS
	}
	if cfg.DecodeTPS > 0 {
		secs += float64(max(maxTokens, 0)) / cfg.DecodeTPS
	}
	limit := MaxLease
	if cfg.MaxLease > 0 {
		limit = cfg.MaxLease
	}
	if !(secs < limit.Seconds()) { // NaN too
		return limit
	}
	return time.Duration(math.Round(secs * float64(time.Second)))
}

// validBooking rejects a decode booking the core does not know.
func validBooking(b DecodeBooking) error {
	switch b {
	case "", BookOutput, BookActive:
		return nil
	}
	return fmt.Errorf("decode booking must be %q or %q, got %q", BookOutput, BookActive, b)
}
