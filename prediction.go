package kvroute

import "time"

// Predicted entries. When a decision books a request on a replica, the
// replica will hold the request's prompt blocks once its prefill is done,
// but the index learns it only from the engine's events, after the
// prefill. Requests that arrive together (an agent's fan-out, a burst of
// one conversation's turns) would otherwise each see every replica as
// cold and spread the shared context over all of them. So the booking
// records, in the same atomic step, a Prediction on the replica it books:
// every pod reads it with the replica's load. An eviction of one of its
// blocks, the request released before its first token, or its expiry
// ends it. A confirming event (the chain's last block stored) makes it
// Confirmed: it stays, due, until its grace has passed, because a
// decision whose lookup read the index before that event and books after
// it sees the chain in neither place otherwise.

// MaxMarks bounds the marks of one prediction, so that a prediction costs
// the same few bytes whatever the prompt's length.
const MaxMarks = 14

// MaxPredictions bounds the predicted entries one replica holds: when a
// booking finds it full, the one that expires first makes room. The
// herding workload keeps up to 36 in flight on each of 4 replicas, and
// dropping all but the 16 latest changed none of the simulator's figures;
// every booking there reads and rewrites them.
const MaxPredictions = 16

// MinPredictBlocks is the fewest blocks a booking predicts beyond what
// its replica already holds: a prediction of a few new blocks on top of a
// held context (a request's own short suffix) is worth less than writing,
// reading and ending it costs, since a request sharing the context finds
// that in the index anyway.
const MinPredictBlocks = 4

// smallMark is the deepest of a prediction's small marks (8, 4, 2, 1):
// below it the marks near the end stop. A request that shares a
// predicted chain's first d blocks matches it at the deepest mark at or
// below d.
const smallMark = 8

// MaxPredictTTL bounds how long any prediction lives, whatever its
// prefill estimate: one that outlives its request only misleads.
const MaxPredictTTL = 30 * time.Second

// A Mark is one point of a predicted chain: the replica will hold the
// chain's first Depth blocks, the last of which is Key.
type Mark struct {
	Depth int
	Key   BlockKey
}

// PredictMarks is where a prediction of keys is matched: its end; then
// below it, each aligned to its spacing, two marks 4 blocks apart, two 8
// apart, then one at each doubling (16, 32, …); and 8, 4, 2, 1 below
// those: at most MaxMarks in all. Requests that share a context mostly part near its
// end (a fan-out's own instructions, a conversation's next turn), where
// the marks are dense, so a sibling with a short suffix matches within a
// few blocks of where they part; the small ones catch a short shared
// system prompt. They are in increasing depth.
func PredictMarks(keys []BlockKey) []Mark {
	n := len(keys)
	if n == 0 {
		return nil
	}
	const small = 4 // 8, 4, 2, 1
	depths := []int{n}
	step := 4
	for d := (n - 1) / step * step; d > smallMark && len(depths) < MaxMarks-small; {
		depths = append(depths, d)
		if len(depths) >= 5 || len(depths)%2 == 1 {
			step *= 2
		}
		d = (d - 1) / step * step
	}
	for d := smallMark; d >= 1; d /= 2 {
		if d < depths[len(depths)-1] {
			depths = append(depths, d)
		}
	}
	marks := make([]Mark, len(depths))
	for i, d := range depths {
		marks[len(depths)-1-i] = Mark{Depth: d, Key: keys[d-1]}
	}
	return marks
}

// PredictPlan is what a booking asks the store to predict on the replica
// it books (Lease.Predict).
type PredictPlan struct {
	Marks []Mark
	// PerBlock is the prefill time of one block, at the router's
	// configured engine speed: the prediction is due when the prefill
	// booked on the replica, this request's included, has run.
	PerBlock time.Duration
	// Grace is how long past its due time a prediction waits for the
	// event that confirms it (the engine's event delay and more).
	Grace time.Duration
}

// Timing is when a prediction booked at now is due and when it expires,
// with span the prefill blocks booked on the replica once the request is:
// due after span blocks at PerBlock, expiring Grace later, never more than
// MaxPredictTTL after now. It counts in whole milliseconds, as the
// booking scripts do (store/lua/predict.lua), so both land on the same
// times.
func (p PredictPlan) Timing(now time.Time, span int64) (ready, expires time.Time) {
	nowMs := now.UnixMilli()
	perUs := p.PerBlock.Microseconds()
	maxMs := MaxPredictTTL.Milliseconds()
	graceMs := min(max(p.Grace.Milliseconds(), 0), maxMs)
	due := min(max(span, 0)*perUs/1000, maxMs-graceMs)
	return time.UnixMilli(nowMs + due), time.UnixMilli(nowMs + due + graceMs)
}

// A Prediction is a booking's forecast that a replica will hold a chain.
type Prediction struct {
	// Owner is the request whose booking made it.
	Owner string
	// Start is when it was booked, Ready when its prefill is due (its
	// first token, when that came first), Expires when it ends
	// unconfirmed.
	Start, Ready, Expires time.Time
	// Span is the prefill blocks booked on the replica, this request's
	// included, when it was booked: what runs before the chain is held.
	Span  int64
	Marks []Mark
	// Confirmed says the event storing the chain's end came: the chain
	// is held, the prediction due, and it is kept only as a bridge for
	// bookings whose lookup read the index before that event (lookups
	// skip it: PredictedOverlap). Its expiry is no phantom.
	Confirmed bool
}

// Depth is how many leading blocks of keys p predicts: the deepest of its
// marks that keys pass through, 0 for none.
func (p Prediction) Depth(keys []BlockKey) int {
	for i := len(p.Marks) - 1; i >= 0; i-- {
		m := p.Marks[i]
		if m.Depth <= len(keys) && m.Depth > 0 && keys[m.Depth-1] == m.Key {
			return m.Depth
		}
	}
	return 0
}

// DueAt makes p due at now (its first token came, or its confirming
// event: its prefill has run), if it was due later, and expiring as much
// sooner: its grace (expiry less due) after now, never before Start. It
// counts in whole milliseconds, as store/lua/predict.lua's pdue does, and
// reports whether p changed.
func (p *Prediction) DueAt(now time.Time) bool {
	ms := time.UnixMilli(now.UnixMilli())
	if !ms.Before(p.Ready) {
		return false
	}
	due := ms
	if due.Before(p.Start) {
		due = p.Start
	}
	p.Expires = p.Expires.Add(-p.Ready.Sub(due))
	p.Ready = due
	return true
}

// Progress is how far p's prefill is at now, 0 at Start to 1 when due.
func (p Prediction) Progress(now time.Time) float64 {
	span := p.Ready.Sub(p.Start)
	if span <= 0 || !now.Before(p.Ready) {
		return 1
	}
	if !now.After(p.Start) {
		return 0
	}
	return float64(now.Sub(p.Start)) / float64(span)
}

// PredictedOverlap is what a replica's live predictions (those neither
// expired at now nor confirmed) say about keys: the most leading blocks any predicts,
// and that prediction's progress and remaining wait (the prefill blocks
// still to run before it is held: (1 − progress) × Span). Among
// predictions of the same depth the one with the least wait counts: it
// is the one the request would share. A confirmed prediction is left to
// the index, which a lookup reads with it and which says what is still
// held; only a booking looking again (store/lua/reservebest.lua) counts
// it, against what its lookup found held before the event.
func PredictedOverlap(preds []Prediction, keys []BlockKey, now time.Time) (depth int, ready, wait float64) {
	for _, p := range preds {
		if p.Confirmed || !now.Before(p.Expires) {
			continue
		}
		d := p.Depth(keys)
		if d == 0 || d < depth {
			continue
		}
		r := p.Progress(now)
		w := (1 - r) * float64(p.Span)
		if d > depth || w < wait {
			depth, ready, wait = d, r, w
		}
	}
	return depth, ready, wait
}
