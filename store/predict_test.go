package store_test

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/store"
)

// plan is a prediction of keys at 10 ms a block, waiting 2 s past due.
func plan(keys []kvroute.BlockKey) *kvroute.PredictPlan {
	return &kvroute.PredictPlan{Marks: kvroute.PredictMarks(keys), PerBlock: 10 * time.Millisecond, Grace: 2 * time.Second}
}

// predictions reads replica r's predicted entries.
func predictions(t *testing.T, e *env, r string) []kvroute.Prediction {
	t.Helper()
	p, err := e.s.Predictions(context.Background(), mdl, []string{r})
	if err != nil {
		t.Fatalf("predictions: %v", err)
	}
	return p[0]
}

// countPredictions has e's store count prediction outcomes into the
// reader it returns (read with predictCounts).
func countPredictions(t *testing.T, e *env) *metric.ManualReader {
	t.Helper()
	rd := metric.NewManualReader()
	if err := e.s.CountPredictions(metric.NewMeterProvider(metric.WithReader(rd))); err != nil {
		t.Fatal(err)
	}
	return rd
}

// predictCounts reads kvroute_predictions_total by outcome.
func predictCounts(t *testing.T, rd *metric.ManualReader) map[string]int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := rd.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name != "kvroute_predictions_total" {
				continue
			}
			for _, dp := range m.Data.(metricdata.Sum[int64]).DataPoints {
				v, _ := dp.Attributes.Value("outcome")
				out[v.AsString()] += dp.Value
			}
		}
	}
	return out
}

// TestPredictions holds the booking scripts' predicted entries to
// kvroute's own definitions (PredictPlan.Timing, PredictedOverlap) and
// walks each way one ends, on miniredis and a real redis-server.
func TestPredictions(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		rd := countPredictions(t, e)
		keys := chain(rand.New(rand.NewPCG(1, 2)), 40)
		exp := e.clk.Now().Add(time.Minute)
		t.Run("a booking writes it, due when the replica's prefill has run", func(t *testing.T) {
			l := lease("p1", "a", 30, 2, exp)
			l.Predict = plan(keys)
			if ok, _, err := e.s.Reserve(ctx, l, -1); err != nil || !ok {
				t.Fatalf("reserve: %v %v", ok, err)
			}
			l2 := lease("p2", "a", 10, 2, exp)
			l2.Predict = plan(keys[:20])
			if ok, _, err := e.s.Reserve(ctx, l2, -1); err != nil || !ok {
				t.Fatalf("reserve: %v %v", ok, err)
			}
			got := predictions(t, e, "a")
			if len(got) != 2 {
				t.Fatalf("got %d predictions, want 2", len(got))
			}
			for i, c := range []struct {
				owner string
				span  int64
				marks []kvroute.Mark
			}{{rid("p1"), 30, plan(keys).Marks}, {rid("p2"), 40, plan(keys[:20]).Marks}} {
				ready, expires := plan(keys).Timing(e.clk.Now(), c.span)
				p := got[i]
				if p.Owner != c.owner || p.Span != c.span || !p.Start.Equal(time.UnixMilli(e.clk.Now().UnixMilli())) || !p.Ready.Equal(ready) || !p.Expires.Equal(expires) {
					t.Errorf("prediction %d: got %s span %d %v..%v..%v, want %s span %d due %v expiring %v", i, p.Owner, p.Span, p.Start, p.Ready, p.Expires, c.owner, c.span, ready, expires)
				}
				if len(p.Marks) != len(c.marks) || p.Marks[len(p.Marks)-1] != c.marks[len(c.marks)-1] {
					t.Errorf("prediction %d: marks %v, want %v", i, p.Marks, c.marks)
				}
			}
		})
		t.Run("a lookup reads it as PredictedOverlap does", func(t *testing.T) {
			e.clk.Add(100 * time.Millisecond)
			ask := append(append([]kvroute.BlockKey(nil), keys[:36]...), chain(rand.New(rand.NewPCG(3, 4)), 4)...)
			ov, _, err := e.s.Lookup(ctx, mdl, ask, []string{"a", "b"})
			if err != nil {
				t.Fatal(err)
			}
			d, r, w := kvroute.PredictedOverlap(predictions(t, e, "a"), ask, e.clk.Now())
			if d != 36 || ov[0].Predicted != d || ov[0].Ready != r || ov[0].Wait != w {
				t.Errorf("lookup: got %d blocks (progress %v, wait %v), want %d (%v, %v) and 36", ov[0].Predicted, ov[0].Ready, ov[0].Wait, d, r, w)
			}
			if ov[1].Predicted != 0 {
				t.Errorf("replica b: got %d predicted blocks, want 0", ov[1].Predicted)
			}
		})
		t.Run("the first token makes it due", func(t *testing.T) {
			if _, err := e.s.Advance(ctx, rid("p1")); err != nil {
				t.Fatal(err)
			}
			if p := predictions(t, e, "a")[0]; !p.Ready.Equal(time.UnixMilli(e.clk.Now().UnixMilli())) {
				t.Errorf("after the first token: due %v, want now %v", p.Ready, e.clk.Now())
			}
		})
		t.Run("a release before the first token withdraws it; one after does not", func(t *testing.T) {
			for _, id := range []string{"p1", "p2"} {
				if ok, err := e.s.Release(ctx, rid(id)); err != nil || !ok {
					t.Fatalf("release %s: %v %v", id, ok, err)
				}
			}
			got := predictions(t, e, "a")
			if len(got) != 1 || got[0].Owner != rid("p1") {
				t.Errorf("after the releases: %d predictions (%v), want p1's alone", len(got), got)
			}
		})
		t.Run("the event storing its end confirms it", func(t *testing.T) {
			if _, err := e.s.Apply(ctx, mdl, "a", 1, storeChain(keys, 0, 40, kvroute.TierGPU)); err != nil {
				t.Fatal(err)
			}
			got := predictions(t, e, "a")
			if len(got) != 1 || !got[0].Confirmed || got[0].Owner != rid("p1") {
				t.Errorf("after the confirming event: %d predictions (%+v), want p1's, confirmed", len(got), got)
			}
		})
		t.Run("an eviction of one of its blocks ends it", func(t *testing.T) {
			l := lease("p3", "b", 10, 2, exp)
			l.Predict = plan(keys)
			if ok, _, err := e.s.ReserveBest(ctx, l, []kvroute.Choice{{Replica: "b", PrefillBlocks: 10}}, kvroute.ChoiceCost{PrefillScale: 1, Blocks: 40, Bound: 1e18}); err != nil || ok != 0 {
				t.Fatalf("reserve best: %v %v", ok, err)
			}
			if got := predictions(t, e, "b"); len(got) != 1 {
				t.Fatalf("after a settled booking: %d predictions, want 1", len(got))
			}
			ops := storeChain(keys, 0, 16, kvroute.TierGPU)
			if _, err := e.s.Apply(ctx, mdl, "b", 1, ops); err != nil {
				t.Fatal(err)
			}
			if _, err := e.s.Apply(ctx, mdl, "b", 2, []kvroute.IndexOp{remove1(keys[15], kvroute.TierGPU)}); err != nil {
				t.Fatal(err)
			}
			if got := predictions(t, e, "b"); len(got) != 0 {
				t.Errorf("after an eviction of its mark at 16: %d predictions, want 0", len(got))
			}
		})
		t.Run("one that expired is dropped by the next booking, and a full list makes room", func(t *testing.T) {
			for i := range kvroute.MaxPredictions + 2 {
				l := lease("q"+strconv.Itoa(i), "c", 1, 1, exp)
				l.Predict = plan(keys[:8+i%30])
				if _, _, err := e.s.Reserve(ctx, l, -1); err != nil {
					t.Fatal(err)
				}
				if i == 0 {
					e.clk.Add(time.Minute) // q0's expires
				}
			}
			if got := predictions(t, e, "c"); len(got) != kvroute.MaxPredictions {
				t.Errorf("got %d predictions, want %d", len(got), kvroute.MaxPredictions)
			}
		})
		t.Run("every outcome is counted", func(t *testing.T) {
			got := predictCounts(t, rd)
			want := map[string]int64{store.PredictWritten: 3 + kvroute.MaxPredictions + 2, store.PredictConfirmed: 1, store.PredictEvicted: 1,
				store.PredictExpired: 2, store.PredictWithdrawn: 1}
			for k, v := range want {
				if got[k] != v {
					t.Errorf("%s: got %d, want %d (all: %v)", k, got[k], v, got)
				}
			}
		})
	})
}

// TestBurstFindsPredictions: decisions that looked up together, before
// any booked, still land on the replica the first of them booked: the
// booking finds its prediction there and credits it, as a lookup would
// have.
func TestBurstFindsPredictions(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		shared := chain(rand.New(rand.NewPCG(5, 6)), 124)
		exp := e.clk.Now().Add(time.Minute)
		// As every decision of the burst scored it: nothing cached
		// anywhere, so each owes its whole prompt of 127 blocks.
		const blocks = 127
		cost := kvroute.ChoiceCost{PrefillScale: 2, Blocks: blocks, Active: 1, Bound: 1e18, Eps: 1e-9, OverlapCredit: 4, PredictWeight: 0.75}
		choices := []kvroute.Choice{{Replica: "a", PrefillBlocks: blocks, Floor: blocks}, {Replica: "b", PrefillBlocks: blocks, Floor: blocks},
			{Replica: "c", PrefillBlocks: blocks, Floor: blocks}}
		for _, weight := range []float64{0.75, 0} {
			name := "predictions on"
			if weight == 0 {
				name = "predictions off"
			}
			t.Run(name, func(t *testing.T) {
				cost.PredictWeight = weight
				got := map[string]int{}
				for i := range 8 {
					own := chain(rand.New(rand.NewPCG(uint64(i), 9)), 3)
					keys := append(append([]kvroute.BlockKey(nil), shared...), own...)
					l := lease(name+strconv.Itoa(i), "", blocks, 1, exp)
					l.Predict = plan(keys)
					j, _, err := e.s.ReserveBest(ctx, l, choices, cost)
					if err != nil {
						t.Fatal(err)
					}
					got[choices[j].Replica]++
				}
				switch {
				case weight > 0 && got["a"] != 8:
					t.Errorf("placed %v, want all 8 on a (the first booking's replica)", got)
				case weight == 0 && (got["a"] == 8 || got["b"] == 0):
					t.Errorf("placed %v, want them spread by load", got)
				}
				// The later bookings owe only what the first does not
				// compute for them.
				if weight > 0 {
					if l := loadOf(t, e, "a"); l.PrefillBlocks >= 2*blocks {
						t.Errorf("a's booked prefill %d, want the first's %d and a few blocks a booking", l.PrefillBlocks, blocks)
					}
				}
			})
			for _, r := range []string{"a", "b", "c"} {
				if _, err := e.rc.HDel(ctx, "kvr:{m:"+mdl+"}:load", r, r+"#p").Result(); err != nil {
					t.Fatal(err)
				}
			}
		}
	})
}

// TestConfirmedPredictionBridges: a decision that looked up before the
// event confirming a prediction, and books after it, saw the chain
// neither in the index nor predicted. The confirmed record stays, due at
// the event, until its grace has passed, so the booking still finds the
// replica computing its context; its later ends are not counted as a
// second fate. Before, the event deleted the record and a burst on a busy
// machine split over two replicas (tests' TestBurstSharedContextLive).
func TestConfirmedPredictionBridges(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		rd := countPredictions(t, e)
		shared := chain(rand.New(rand.NewPCG(7, 8)), 60)
		exp := e.clk.Now().Add(time.Minute)
		const blocks = 62
		cost := kvroute.ChoiceCost{PrefillScale: 2, Blocks: blocks, Active: 1, Bound: 1e18, Eps: 1e-9, OverlapCredit: 2, PredictWeight: 0.75}
		// Both choices as a lookup before anything was booked scored
		// them: cold.
		choices := []kvroute.Choice{{Replica: "a", PrefillBlocks: blocks, Floor: blocks}, {Replica: "b", PrefillBlocks: blocks, Floor: blocks}}
		request := func(i int) kvroute.Lease {
			keys := append(append([]kvroute.BlockKey(nil), shared...), chain(rand.New(rand.NewPCG(uint64(i), 10)), 2)...)
			l := lease("bridge"+strconv.Itoa(i), "", blocks, 1, exp)
			l.Predict = plan(keys)
			return l
		}
		first := request(0)
		if j, _, err := e.s.ReserveBest(ctx, first, choices, cost); err != nil || j != 0 {
			t.Fatalf("first booking: got choice %d (%v), want a", j, err)
		}
		e.clk.Add(50 * time.Millisecond)
		ops := storeChain(append(append([]kvroute.BlockKey(nil), shared...), chain(rand.New(rand.NewPCG(0, 10)), 2)...), 0, blocks, kvroute.TierGPU)
		if _, err := e.s.Apply(ctx, mdl, "a", 1, ops); err != nil {
			t.Fatal(err)
		}
		t.Run("it stays confirmed, due at the event", func(t *testing.T) {
			got := predictions(t, e, "a")
			if len(got) != 1 || !got[0].Confirmed || !got[0].Ready.Equal(time.UnixMilli(e.clk.Now().UnixMilli())) {
				t.Fatalf("after the confirming event: %+v, want one confirmed, due now %v", got, e.clk.Now())
			}
			if want := got[0].Ready.Add(plan(nil).Grace); !got[0].Expires.Equal(want) {
				t.Errorf("expires %v, want its grace after the event, %v", got[0].Expires, want)
			}
		})
		t.Run("a booking whose lookup missed the event finds it", func(t *testing.T) {
			j, _, err := e.s.ReserveBest(ctx, request(1), choices, cost)
			if err != nil {
				t.Fatal(err)
			}
			if got := choices[j].Replica; got != "a" {
				t.Errorf("booked %s, want a (computing the shared context)", got)
			}
		})
		t.Run("a release before the first token keeps it", func(t *testing.T) {
			if ok, err := e.s.Release(ctx, first.RequestID); err != nil || !ok {
				t.Fatalf("release: %v %v", ok, err)
			}
			if got := predictions(t, e, "a"); len(got) == 0 || !got[0].Confirmed {
				t.Errorf("after the release: %+v, want the confirmed record kept", got)
			}
		})
		t.Run("its end is counted once", func(t *testing.T) {
			if _, err := e.s.Apply(ctx, mdl, "a", 2, []kvroute.IndexOp{remove1(ops[blocks-1].Key, kvroute.TierGPU)}); err != nil {
				t.Fatal(err)
			}
			got := predictCounts(t, rd)
			want := map[string]int64{store.PredictWritten: 2, store.PredictConfirmed: 1}
			for _, k := range []string{store.PredictWritten, store.PredictConfirmed, store.PredictEvicted, store.PredictExpired, store.PredictWithdrawn} {
				if got[k] != want[k] {
					t.Errorf("%s: got %d, want %d (all: %v)", k, got[k], want[k], got)
				}
			}
		})
	})
}

// TestPredictScriptMax holds lua/predict.lua's bounds to kvroute's
// MaxPredictions and MinPredictBlocks.
func TestPredictScriptMax(t *testing.T) {
	src, err := os.ReadFile("lua/predict.lua")
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"local PREDICT_MAX = " + strconv.Itoa(kvroute.MaxPredictions) + "\n",
		"local PREDICT_MIN = " + strconv.Itoa(kvroute.MinPredictBlocks) + "\n",
	} {
		if !strings.Contains(string(src), want) {
			t.Errorf("lua/predict.lua does not say %q", want)
		}
	}
}
