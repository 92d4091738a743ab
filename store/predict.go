package store

import (
	"context"
	"encoding/binary"
	"strconv"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/kvroute/kvroute"
)

// Predicted entries (kvroute/prediction.go) live in the load hash, field
// "<replica>#p", beside the replica's load: a booking writes its
// prediction in the step that books (lua/predict.lua, included by the
// booking scripts), and a lookup reads every candidate's with the loads it
// reads anyway, so a prediction costs a decision no round trip and no key.

// ownerLen bounds the request id a prediction is filed under, as
// lua/predict.lua's callers cut it: ids are unique in their first bytes.
const ownerLen = 64

// predictArgs are a booking script's prediction arguments: the caller's
// clock, the plan's µs a block, its grace and longest due time in ms, and
// its marks (11 bytes each: depth in 3 bytes, router key in 8); no marks
// when the lease predicts nothing.
func (s *Store) predictArgs(l kvroute.Lease) []any {
	p := l.Predict
	if p == nil || len(p.Marks) == 0 {
		return []any{"0", "0", "0", "0", ""}
	}
	maxMs := kvroute.MaxPredictTTL.Milliseconds()
	grace := min(max(p.Grace.Milliseconds(), 0), maxMs)
	marks := make([]byte, 0, 11*len(p.Marks))
	for _, m := range p.Marks {
		d := min(max(m.Depth, 0), 1<<24-1)
		marks = append(marks, byte(d>>16), byte(d>>8), byte(d))
		marks = binary.BigEndian.AppendUint64(marks, uint64(m.Key))
	}
	return []any{s.nowMs(), strconv.FormatInt(p.PerBlock.Microseconds(), 10),
		strconv.FormatInt(grace, 10), strconv.FormatInt(maxMs-grace, 10), marks}
}

// confirmedFlag is the marks byte's bit of a confirmed record
// (lua/predict.lua's CONFIRMED).
const confirmedFlag = 0x80

// decodePredictions parses a "<replica>#p" field (lua/predict.lua's
// layout); a record cut short ends the list.
func decodePredictions(v string) []kvroute.Prediction {
	var out []kvroute.Prediction
	num := func(b string) int64 {
		var n int64
		for i := 0; i < len(b); i++ {
			n = n<<8 | int64(b[i])
		}
		return n
	}
	for i := 0; i < len(v); {
		ol := int(v[i])
		j := i + 1 + ol
		if j+23 > len(v) {
			break
		}
		nm := int(v[j+22] &^ confirmedFlag)
		end := j + 23 + 11*nm
		if end > len(v) {
			break
		}
		p := kvroute.Prediction{
			Owner: v[i+1 : j],
			Start: time.UnixMilli(num(v[j : j+6])), Ready: time.UnixMilli(num(v[j+6 : j+12])),
			Expires: time.UnixMilli(num(v[j+12 : j+18])), Span: num(v[j+18 : j+22]),
			Marks: make([]kvroute.Mark, nm), Confirmed: v[j+22]&confirmedFlag != 0,
		}
		for k := range nm {
			m := v[j+23+11*k:]
			p.Marks[k] = kvroute.Mark{Depth: int(num(m[:3])), Key: kvroute.BlockKey(uint64(num(m[3:11])))}
		}
		out = append(out, p)
		i = end
	}
	return out
}

// Predictions returns the predicted entries held for each replica, in
// order (expired ones included: a lookup ignores them, the next booking
// there drops them).
func (s *Store) Predictions(ctx context.Context, model string, replicas []string) ([][]kvroute.Prediction, error) {
	if len(replicas) == 0 {
		return nil, nil
	}
	fields := make([]string, len(replicas))
	for i, r := range replicas {
		fields[i] = r + "#p"
	}
	v, err := s.c.HMGet(ctx, loadKey(model), fields...).Result()
	if err != nil {
		return nil, wrap("predictions", err)
	}
	out := make([][]kvroute.Prediction, len(replicas))
	for i := range out {
		if str, ok := v[i].(string); ok {
			out[i] = decodePredictions(str)
		}
	}
	return out, nil
}

// Prediction outcomes, kvroute_predictions_total's outcome label.
const (
	PredictWritten   = "written"
	PredictConfirmed = "confirmed"
	PredictEvicted   = "evicted"
	PredictExpired   = "expired"
	PredictWithdrawn = "withdrawn"
)

// CountPredictions counts what this process's calls did to predicted
// entries on mp (kvroute_predictions_total by outcome): a pod writes them
// with its bookings, drops expired ones it finds there and withdraws
// those of requests that end before their first token; an ingestor's
// applies confirm them (the chain's end stored) or end them (a block of
// it evicted, or the replica cleared). Summed over processes it is every
// prediction's fate. Without it nothing is counted.
func (s *Store) CountPredictions(mp metric.MeterProvider) error {
	c, err := mp.Meter("github.com/kvroute/kvroute/store").Int64Counter("kvroute_predictions_total",
		metric.WithDescription("Predicted entries (a booking's forecast that its replica will hold the prompt) by outcome: written by a booking; confirmed by the event storing the chain's end; evicted (a block of it removed, or the replica cleared); expired unconfirmed, found by a later booking (a phantom of its own); withdrawn (its request ended before its first token)."))
	if err != nil {
		return err
	}
	s.predCount.Store(&c)
	return nil
}

// countPredictions adds n predictions with outcome, when counted.
func (s *Store) countPredictions(ctx context.Context, outcome string, n int64) {
	if c := s.predCount.Load(); c != nil && n > 0 {
		(*c).Add(ctx, n, metric.WithAttributes(attribute.String("outcome", outcome)))
	}
}
