package sim_test

import (
	"bytes"
	"context"
	"encoding/json"
	"math"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/sim"
)

// steady is n requests gap apart, each a 1,024-token prompt of its own
// (nothing cached) and 16 to 112 output tokens (64 on average, spread so
// that completions do not fall in lockstep): 0.1 s of prefill and 2.1 s
// of decode on average on the default engine.
func steady(n int, gap time.Duration) sim.Workload {
	w := sim.Workload{Name: "steady", BlockTokens: 512}
	for i := range n {
		w.Requests = append(w.Requests, sim.Request{
			Arrival:      time.Duration(i) * gap,
			Keys:         []kvroute.BlockKey{kvroute.BlockKey(2*i + 1), kvroute.BlockKey(2*i + 2)},
			PromptTokens: 1024, OutputTokens: 16 + (i*37)%97,
		})
	}
	return w
}

// capacity is steady's throughput on two replicas running 8 requests
// each (--max-num-seqs 8, and --max-requests 8 to match): 16 requests of
// 2.2 s at once.
var capacity = 16 / 2.2

func limited(lim admission.Config) sim.Config {
	lim.Enabled = true
	if lim.Limits.IsZero() {
		lim.Limits.MaxRequests = 8
	}
	return sim.Config{Replicas: 2, MaxBatch: 8, Seed: 1, Admission: lim}
}

func runAll(tb testing.TB, cfg sim.Config, w sim.Workload) sim.Report {
	tb.Helper()
	r, err := sim.Run(context.Background(), cfg, scoring.DefaultConfig(), w)
	if err != nil {
		tb.Fatal(err)
	}
	return r
}

func band(tb testing.TB, r sim.Report, prio int) sim.ClassStats {
	tb.Helper()
	if r.Admission == nil {
		tb.Fatal("no admission report")
	}
	for _, b := range r.Admission.Bands {
		if b.Priority == prio {
			return b.ClassStats
		}
	}
	tb.Fatalf("no band %d in %+v", prio, r.Admission.Bands)
	return sim.ClassStats{}
}

func TestAdmission(t *testing.T) {
	t.Run("high band at twice capacity", func(t *testing.T) {
		// Twice the fleet's capacity, a fifth of it in band -1: the high
		// band is served first, so its TTFT stays near an unloaded
		// fleet's and none of it is shed; the rest queue and shed.
		gap := time.Duration(float64(time.Second) / (2 * capacity))
		w := steady(600, gap)
		if err := w.Tag(sim.Tagging{PriorityShare: 0.2, Priority: -1, Seed: 3}); err != nil {
			t.Fatal(err)
		}
		r := runAll(t, limited(admission.Config{TTL: 10 * time.Second}), w)
		unloaded := runAll(t, sim.Config{Replicas: 2, MaxBatch: 8, Seed: 1}, steady(600, 4*gap))
		high, low := band(t, r, -1), band(t, r, 0)
		t.Logf("high %+v\nlow %+v\nunloaded TTFT %+v\nshed %v", high, low, unloaded.TTFT, r.Admission.Shed)
		if got, want := high.Requests, 120; got != want {
			t.Errorf("high band: %d requests, want %d (a fifth)", got, want)
		}
		if high.Shed != 0 || high.Admitted != high.Requests {
			t.Errorf("high band: %d shed, %d of %d admitted; want none shed", high.Shed, high.Admitted, high.Requests)
		}
		// Without preemption a high request still waits for some running
		// request to end: the fleet frees a slot every 0.14 s on average,
		// so its p99 is the unloaded one plus a few turnovers, where the
		// same overload without admission piles up tens of seconds.
		if got, lim := high.TTFT.P99, unloaded.TTFT.P99+1000; got > lim {
			t.Errorf("high band TTFT p99 %v ms, want within 1 s of unloaded %v", got, unloaded.TTFT.P99)
		}
		if none := runAll(t, sim.Config{Replicas: 2, MaxBatch: 8, Seed: 1}, w); none.TTFT.P99 < 10*high.TTFT.P99 {
			t.Errorf("without admission TTFT p99 %v ms, want far above the high band's %v with it", none.TTFT.P99, high.TTFT.P99)
		} else {
			t.Logf("without admission: TTFT p99 %v ms", none.TTFT.P99)
		}
		if low.Shed == 0 || r.Admission.Shed[kvroute.ShedTTL] != low.Shed {
			t.Errorf("low band shed %d (%v), want some, all by TTL", low.Shed, r.Admission.Shed)
		}
		if low.TTFT.P99 < 5*high.TTFT.P99 {
			t.Errorf("low band TTFT p99 %v ms, want far above the high band's %v", low.TTFT.P99, high.TTFT.P99)
		}
		for p, rs := range r.PerReplica {
			if rs.Requests == 0 {
				t.Errorf("replica %d got nothing", p)
			}
		}
	})
	t.Run("tenants at 10 to 1 share the fleet", func(t *testing.T) {
		// Seven times capacity, split 10:1: even the small tenant offers
		// more than half the fleet, so both stay backlogged, and fair
		// queuing serves them the same cost.
		gap := time.Duration(float64(time.Second) / (7 * capacity))
		w := steady(11000, gap)
		if err := w.Tag(sim.Tagging{Tenants: []sim.TenantShare{{"big", 10}, {"small", 1}}}); err != nil {
			t.Fatal(err)
		}
		r := runAll(t, limited(admission.Config{TTL: 3 * time.Second}), w)
		ts := r.Admission.Tenants
		if len(ts) != 2 {
			t.Fatalf("tenants %+v, want 2", ts)
		}
		t.Logf("tenants %+v", ts)
		big, small := ts[0].ClassStats, ts[1].ClassStats
		if got := float64(big.Requests) / float64(small.Requests); math.Abs(got-10) > 0.05 {
			t.Errorf("requests big/small %v, want 10", got)
		}
		// The first 16 requests are admitted at once, in the 10:1 mix,
		// before anything queues: that start is big's only edge.
		if got := float64(big.ServedCost) / float64(small.ServedCost); got < 0.97 || got > 1.03 {
			t.Errorf("served cost big/small %v (%d, %d), want within 3%% of 1", got, big.ServedCost, small.ServedCost)
		}
	})
	t.Run("fleet in-flight limit", func(t *testing.T) {
		w := steady(200, 20*time.Millisecond)
		cfg := limited(admission.Config{Limits: kvroute.Limits{MaxRequests: 1000}, MaxInFlight: 4, TTL: time.Hour})
		r := runAll(t, cfg, w)
		if r.Completed != 200 || r.Admission.Queued == 0 {
			t.Errorf("completed %d, queued %d: want all, some queued", r.Completed, r.Admission.Queued)
		}
		// 4 at a time of 2.2 s each: 200 requests take 110 s at least.
		if r.MakespanS < 105 {
			t.Errorf("makespan %v s, want at least 105 (4 in flight)", r.MakespanS)
		}
	})
	t.Run("queue limit sheds", func(t *testing.T) {
		w := steady(100, time.Millisecond)
		r := runAll(t, limited(admission.Config{QueueLimit: 10, TTL: time.Hour}), w)
		if got, want := r.Admission.Shed[kvroute.ShedQueueFull], 100-16-10; got != want {
			t.Errorf("shed queue_full %d, want %d (%v)", got, want, r.Admission.Shed)
		}
		if got, want := r.Completed, 26; got != want {
			t.Errorf("completed %d, want %d", got, want)
		}
	})
	for _, tc := range []struct {
		name string
		lim  kvroute.Limits
		gap  time.Duration
	}{
		// 0.01 of 400 blocks is 4: more than one running request's 3
		// (the engine's KV usage counts running requests only).
		{"kv usage limit", kvroute.Limits{MaxKVUsage: 0.01}, 150 * time.Millisecond},
		{"waiting limit", kvroute.Limits{MaxWaiting: 1}, time.Millisecond},
		{"prefill tokens limit", kvroute.Limits{MaxPrefillTokens: 2048}, time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := limited(admission.Config{Limits: tc.lim, TTL: time.Hour})
			cfg.CapacityBlocks = 400
			r := runAll(t, cfg, steady(100, tc.gap))
			if r.Completed != 100 || r.Admission.Queued == 0 {
				t.Errorf("completed %d, queued %d: want all, some queued", r.Completed, r.Admission.Queued)
			}
		})
	}
	t.Run("no limit changes nothing", func(t *testing.T) {
		f, err := os.Open(headPath)
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		w, err := sim.LoadMooncake(f, sim.MooncakeOptions{Limit: 300})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Tag(sim.Tagging{PriorityShare: 0.5, Tenants: []sim.TenantShare{{"a", 1}, {"b", 2}}}); err != nil {
			t.Fatal(err)
		}
		base := sim.Config{Replicas: 4, EventDelay: 5 * time.Millisecond, EventLoss: 0.05, Seed: 42}
		on := base
		on.Admission = admission.Config{Enabled: true, QueueLimit: 1, TTL: time.Millisecond}
		off := base
		off.Admission = admission.Config{Limits: kvroute.Limits{MaxRequests: 1}}
		want := reportsJSON(t, base, w)
		for name, cfg := range map[string]sim.Config{"enabled without limits": on, "limits but disabled": off} {
			if got := reportsJSON(t, cfg, w); !bytes.Equal(got, want) {
				t.Errorf("%s: reports differ from a run without admission", name)
			}
		}
	})
}

func reportsJSON(tb testing.TB, cfg sim.Config, w sim.Workload) []byte {
	tb.Helper()
	rs, err := sim.Compare(context.Background(), cfg, scoring.DefaultConfig(), scoring.Policies, w)
	if err != nil {
		tb.Fatal(err)
	}
	b, err := json.Marshal(rs)
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

func TestTag(t *testing.T) {
	t.Run("shares", func(t *testing.T) {
		w := steady(1000, time.Millisecond)
		if err := w.Tag(sim.Tagging{PriorityShare: 0.25, Priority: 2, Tenants: []sim.TenantShare{{"a", 3}, {"b", 1}}, Seed: 9}); err != nil {
			t.Fatal(err)
		}
		prio, tenants := 0, map[string]int{}
		for _, q := range w.Requests {
			if q.Priority == 2 {
				prio++
			}
			tenants[q.Tenant]++
		}
		if prio != 250 {
			t.Errorf("%d requests in band 2, want 250", prio)
		}
		if tenants["a"] != 750 || tenants["b"] != 250 {
			t.Errorf("tenants %v, want a 750, b 250", tenants)
		}
		if got := w.Requests[0].Tenant + w.Requests[1].Tenant + w.Requests[2].Tenant + w.Requests[3].Tenant; got != "aaba" {
			t.Errorf("first four tenants %q, want interleaved aaba", got)
		}
	})
	t.Run("deterministic", func(t *testing.T) {
		a, b := steady(100, time.Millisecond), steady(100, time.Millisecond)
		for _, w := range []*sim.Workload{&a, &b} {
			if err := w.Tag(sim.Tagging{PriorityShare: 0.3, Seed: 5}); err != nil {
				t.Fatal(err)
			}
		}
		for i := range a.Requests {
			if a.Requests[i].Priority != b.Requests[i].Priority {
				t.Fatalf("request %d: priority %d and %d", i, a.Requests[i].Priority, b.Requests[i].Priority)
			}
		}
	})
	t.Run("trace fields win", func(t *testing.T) {
		trace := `{"timestamp":0,"input_length":10,"output_length":1,"hash_ids":[1],"priority":3,"tenant":"t"}
{"timestamp":1,"input_length":10,"output_length":1,"hash_ids":[2]}
`
		w, err := sim.LoadMooncake(strings.NewReader(trace), sim.MooncakeOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if err := w.Tag(sim.Tagging{PriorityShare: 1, Priority: -1, Tenants: []sim.TenantShare{{"x", 1}}}); err != nil {
			t.Fatal(err)
		}
		if q := w.Requests[0]; q.Priority != 3 || q.Tenant != "t" {
			t.Errorf("traced request: priority %d tenant %q, want 3, t", q.Priority, q.Tenant)
		}
		if q := w.Requests[1]; q.Priority != -1 || q.Tenant != "x" {
			t.Errorf("untraced request: priority %d tenant %q, want -1, x", q.Priority, q.Tenant)
		}
	})
	for _, tc := range []struct {
		in        string
		share     float64
		prio      int
		wantError bool
	}{
		{"0.2", 0.2, -1, false}, {"0.5:-3", 0.5, -3, false}, {"1:2", 1, 2, false},
		{"1.5", 0, 0, true}, {"x", 0, 0, true}, {"0.1:x", 0, 0, true},
	} {
		t.Run("priority share "+tc.in, func(t *testing.T) {
			s, p, err := sim.ParsePriorityShare(tc.in)
			if (err != nil) != tc.wantError || s != tc.share || p != tc.prio {
				t.Errorf("got %v, %v, %v; want %v, %v, error %v", s, p, err, tc.share, tc.prio, tc.wantError)
			}
		})
	}
	for _, tc := range []struct{ in, want string }{
		{"a=1,b=2", ""}, {"a", "NAME=WEIGHT"}, {"a=0", "> 0"}, {"a=1,a=2", "twice"},
	} {
		t.Run("tenants "+tc.in, func(t *testing.T) {
			_, err := sim.ParseTenants(tc.in)
			if tc.want == "" && err != nil || tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)) {
				t.Errorf("err %v, want %q", err, tc.want)
			}
		})
	}
}
