package kvroute_test

import (
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

func keysN(n int) []kvroute.BlockKey {
	k := make([]kvroute.BlockKey, n)
	for i := range k {
		k[i] = kvroute.BlockKey(1000 + i)
	}
	return k
}

func depths(m []kvroute.Mark) []int {
	out := make([]int, len(m))
	for i, x := range m {
		out[i] = x.Depth
	}
	return out
}

func TestPredictMarks(t *testing.T) {
	tests := []struct {
		name string
		n    int
		want []int
	}{
		{"none", 0, []int{}},
		{"one block", 1, []int{1}},
		{"short", 13, []int{1, 2, 4, 8, 12, 13}},
		{"a stride", 16, []int{1, 2, 4, 8, 12, 16}},
		{"2,000 tokens", 127, []int{1, 2, 4, 8, 64, 96, 104, 112, 120, 124, 127}},
		{"long", 2048, []int{1, 2, 4, 8, 1536, 1792, 1920, 1984, 2016, 2024, 2032, 2040, 2044, 2048}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			keys := keysN(tc.n)
			m := kvroute.PredictMarks(keys)
			if got := depths(m); len(got) != len(tc.want) || (len(got) > 0 && !equal(got, tc.want)) {
				t.Fatalf("marks at %v, want %v", got, tc.want)
			}
			if len(m) > kvroute.MaxMarks {
				t.Errorf("%d marks, want at most %d", len(m), kvroute.MaxMarks)
			}
			for _, x := range m {
				if x.Key != keys[x.Depth-1] {
					t.Errorf("mark at %d names key %v, want %v", x.Depth, x.Key, keys[x.Depth-1])
				}
			}
		})
	}
}

func equal(a, b []int) bool {
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return len(a) == len(b)
}

func TestPredictionDepth(t *testing.T) {
	chain := keysN(127)
	p := kvroute.Prediction{Marks: kvroute.PredictMarks(chain)}
	fork := append(append([]kvroute.BlockKey(nil), chain[:100]...), 7, 8, 9)
	tests := []struct {
		name string
		keys []kvroute.BlockKey
		want int
	}{
		{"the chain itself", chain, 127},
		{"its next turn", append(append([]kvroute.BlockKey(nil), chain...), 1, 2), 127},
		{"a sibling parting at 100: the mark below", fork, 96},
		{"a prefix far short of the end: the small marks", chain[:40], 8},
		{"a sibling with a 3-block suffix of its own", append(append([]kvroute.BlockKey(nil), chain[:124]...), 5, 6, 7), 124},
		{"nothing shared", []kvroute.BlockKey{1, 2, 3}, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := p.Depth(tc.keys); got != tc.want {
				t.Errorf("got %d, want %d", got, tc.want)
			}
		})
	}
}

func TestPredictPlanTiming(t *testing.T) {
	now := time.UnixMilli(1_000_000)
	tests := []struct {
		name          string
		plan          kvroute.PredictPlan
		span          int64
		ready, expire int64 // ms after now
	}{
		{"due after the span", kvroute.PredictPlan{PerBlock: 8 * time.Millisecond, Grace: 2 * time.Second}, 100, 800, 2800},
		{"sub-millisecond blocks round down", kvroute.PredictPlan{PerBlock: 1500 * time.Microsecond, Grace: time.Second}, 3, 4, 1004},
		{"capped at the longest life", kvroute.PredictPlan{PerBlock: time.Second, Grace: 2 * time.Second}, 1000, 28000, 30000},
		{"a grace past the longest life", kvroute.PredictPlan{PerBlock: time.Millisecond, Grace: time.Hour}, 10, 0, 30000},
		{"no span", kvroute.PredictPlan{PerBlock: time.Millisecond, Grace: time.Second}, 0, 0, 1000},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r, e := tc.plan.Timing(now, tc.span)
			if got := r.Sub(now).Milliseconds(); got != tc.ready {
				t.Errorf("due after %d ms, want %d", got, tc.ready)
			}
			if got := e.Sub(now).Milliseconds(); got != tc.expire {
				t.Errorf("expires after %d ms, want %d", got, tc.expire)
			}
		})
	}
}

func TestPredictedOverlap(t *testing.T) {
	t0 := time.UnixMilli(5_000)
	chain := keysN(64)
	mk := func(owner string, start, ready, exp int64, span int64, keys []kvroute.BlockKey) kvroute.Prediction {
		return kvroute.Prediction{Owner: owner, Start: t0.Add(time.Duration(start) * time.Millisecond),
			Ready: t0.Add(time.Duration(ready) * time.Millisecond), Expires: t0.Add(time.Duration(exp) * time.Millisecond),
			Span: span, Marks: kvroute.PredictMarks(keys)}
	}
	first := mk("a", 0, 100, 2100, 64, chain)
	second := mk("b", 0, 200, 2200, 128, chain)
	short := mk("c", 0, 50, 2050, 16, chain[:16])
	confirmed := mk("d", 0, 10, 2010, 64, chain)
	confirmed.Confirmed = true
	tests := []struct {
		name               string
		preds              []kvroute.Prediction
		at                 int64
		depth              int
		progress, waitLeft float64
	}{
		{"none", nil, 0, 0, 0, 0},
		{"booked just now", []kvroute.Prediction{first}, 0, 64, 0, 64},
		{"half way", []kvroute.Prediction{first}, 50, 64, 0.5, 32},
		{"due", []kvroute.Prediction{first}, 150, 64, 1, 0},
		{"expired", []kvroute.Prediction{first}, 2100, 0, 0, 0},
		{"the deepest counts", []kvroute.Prediction{short, second}, 0, 64, 0, 128},
		{"of one depth, the least wait", []kvroute.Prediction{second, first}, 0, 64, 0, 64},
		{"a confirmed one is the index's", []kvroute.Prediction{confirmed, short}, 20, 16, 0.4, 9.6},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			d, r, w := kvroute.PredictedOverlap(tc.preds, chain, t0.Add(time.Duration(tc.at)*time.Millisecond))
			if d != tc.depth || r != tc.progress || w != tc.waitLeft {
				t.Errorf("got depth %d progress %v wait %v, want %d %v %v", d, r, w, tc.depth, tc.progress, tc.waitLeft)
			}
		})
	}
}

// TestPredictionDueAt: a first token or a confirming event makes a
// prediction due then, and expiring as much sooner, never before its
// start and never later than it was.
func TestPredictionDueAt(t *testing.T) {
	t0 := time.UnixMilli(5_000)
	at := func(ms int64) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	tests := []struct {
		name             string
		now              int64
		changed          bool
		ready, expiresAt int64
	}{
		{"before due", 40, true, 40, 2040},
		{"before its start", -10, true, 0, 2000},
		{"after due", 150, false, 100, 2100},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			p := kvroute.Prediction{Start: t0, Ready: at(100), Expires: at(2100)}
			if got := p.DueAt(at(tc.now)); got != tc.changed {
				t.Errorf("changed: got %v, want %v", got, tc.changed)
			}
			if !p.Ready.Equal(at(tc.ready)) || !p.Expires.Equal(at(tc.expiresAt)) {
				t.Errorf("got due %v expiring %v, want %v and %v", p.Ready, p.Expires, at(tc.ready), at(tc.expiresAt))
			}
		})
	}
}
