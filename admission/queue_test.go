package admission_test

import (
	"fmt"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// far is a deadline no test reaches.
var far = t0.Add(time.Hour)

func ticket(id string, prio int, tenant string, cost int64) kvroute.Ticket {
	return kvroute.Ticket{RequestID: id, Model: "m", Priority: prio, Tenant: tenant, Cost: cost, Deadline: far}
}

func push(tb testing.TB, q *admission.Queue, t kvroute.Ticket) kvroute.Admission {
	tb.Helper()
	a := q.Push(t)
	if a.Status != kvroute.Queued {
		tb.Fatalf("push %s: status %v (%s), want queued", t.RequestID, a.Status, a.Reason)
	}
	return a
}

// popAll drains q at t0 and returns the request ids in pop order.
func popAll(tb testing.TB, q *admission.Queue) []string {
	tb.Helper()
	var out []string
	for {
		t, ok := q.Pop(t0)
		if !ok {
			return out
		}
		out = append(out, t.RequestID)
	}
}

func TestQueueOrder(t *testing.T) {
	t.Run("bands are strict", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{})
		push(t, q, ticket("low1", 5, "a", 1))
		push(t, q, ticket("high1", -1, "a", 1000))
		push(t, q, ticket("mid1", 0, "b", 1))
		push(t, q, ticket("high2", -1, "b", 1000))
		got := fmt.Sprint(popAll(t, q))
		if want := "[high1 high2 mid1 low1]"; got != want {
			t.Errorf("order %s, want %s", got, want)
		}
	})
	t.Run("fcfs within a tenant", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{})
		for i := range 5 {
			push(t, q, ticket(strconv.Itoa(i), 0, "a", int64(10-i)))
		}
		got := fmt.Sprint(popAll(t, q))
		if want := "[0 1 2 3 4]"; got != want {
			t.Errorf("order %s, want %s", got, want)
		}
	})
	t.Run("ties by tenant name bytewise", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{})
		push(t, q, ticket("b1", 0, "b", 5))
		push(t, q, ticket("B1", 0, "B", 5))
		push(t, q, ticket("a1", 0, "a", 5))
		push(t, q, ticket("e1", 0, "", 5))
		got := fmt.Sprint(popAll(t, q))
		if want := "[e1 B1 a1 b1]"; got != want {
			t.Errorf("order %s, want %s", got, want)
		}
	})
	t.Run("finish tags by hand", func(t *testing.T) {
		// a costs 3, b costs 1: after a1 (F_a 0->3, V 0) b is served
		// until F_b reaches 3, then a (name) wins the tie.
		q := admission.NewQueue(admission.Config{})
		for i := range 3 {
			push(t, q, ticket("a"+strconv.Itoa(i), 0, "a", 3))
			push(t, q, ticket("b"+strconv.Itoa(i), 0, "b", 1))
		}
		push(t, q, ticket("b3", 0, "b", 1))
		got := fmt.Sprint(popAll(t, q))
		if want := "[a0 b0 b1 b2 a1 b3 a2]"; got != want {
			t.Errorf("order %s, want %s", got, want)
		}
		if f, v := q.Finish(0, "a"); f != 9 || v != 6 {
			t.Errorf("F_a, V = %d, %d, want 9, 6", f, v)
		}
		if f, _ := q.Finish(0, "b"); f != 4 {
			t.Errorf("F_b = %d, want 4", f)
		}
	})
	t.Run("cost below one is charged one", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{})
		push(t, q, ticket("a", 0, "a", 0))
		push(t, q, ticket("b", 0, "b", -5))
		popAll(t, q)
		if f, v := q.Finish(0, "b"); f != 1 || v != 0 {
			t.Errorf("F_b, V = %d, %d, want 1, 0", f, v)
		}
	})
	t.Run("bands keep their own virtual time", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{})
		push(t, q, ticket("x", 1, "a", 100))
		push(t, q, ticket("y", 0, "a", 7))
		popAll(t, q)
		if f, v := q.Finish(0, "a"); f != 7 || v != 0 {
			t.Errorf("band 0: F, V = %d, %d, want 7, 0", f, v)
		}
		if f, v := q.Finish(1, "a"); f != 100 || v != 0 {
			t.Errorf("band 1: F, V = %d, %d, want 100, 0", f, v)
		}
	})
}

// served backlogs every tenant with n tickets of its cost, pops pops
// tickets and returns the cost and the count served per tenant.
func served(tb testing.TB, costs map[string]int64, n, pops int) (cost, count map[string]int64) {
	tb.Helper()
	q := admission.NewQueue(admission.Config{QueueLimit: -1, BandLimit: -1})
	for i := range n {
		for _, name := range []string{"a", "b", "c"} {
			if c, ok := costs[name]; ok {
				push(tb, q, ticket(name+strconv.Itoa(i), 0, name, c))
			}
		}
	}
	cost, count = map[string]int64{}, map[string]int64{}
	for range pops {
		tk, ok := q.Pop(t0)
		if !ok {
			tb.Fatal("queue ran dry")
		}
		cost[tk.Tenant] += tk.Cost
		count[tk.Tenant]++
	}
	return cost, count
}

func TestQueueFairness(t *testing.T) {
	for _, tc := range []struct {
		name  string
		costs map[string]int64
	}{
		{"equal costs", map[string]int64{"a": 100, "b": 100}},
		{"unequal costs", map[string]int64{"a": 700, "b": 130}},
		{"three tenants", map[string]int64{"a": 1000, "b": 37, "c": 250}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cost, _ := served(t, tc.costs, 4000, 3000)
			var lo, hi int64 = math.MaxInt64, 0
			for name := range tc.costs {
				lo, hi = min(lo, cost[name]), max(hi, cost[name])
			}
			// SFQ's bound: served costs differ by at most the largest
			// single cost; here that is well within a few per cent.
			if float64(hi-lo) > 0.03*float64(hi) {
				t.Errorf("served cost %v: spread %d over %d, want within 3%%", cost, hi-lo, hi)
			}
		})
	}
	t.Run("cached requests go further", func(t *testing.T) {
		// b's requests are mostly cached (cost 50 against a's 500): for
		// the same charge b gets ten times the requests.
		cost, count := served(t, map[string]int64{"a": 500, "b": 50}, 3000, 1100)
		if got := float64(count["b"]) / float64(count["a"]); got < 9 || got > 11 {
			t.Errorf("requests served b/a = %v (%v), want about 10", got, count)
		}
		if got := float64(cost["b"]) / float64(cost["a"]); got < 0.95 || got > 1.05 {
			t.Errorf("cost served b/a = %v (%v), want about 1", got, cost)
		}
	})
	t.Run("a newly backlogged tenant banks no credit", func(t *testing.T) {
		// a runs alone for a while; when b arrives it must not be served
		// for the whole time it was away, only share from then on.
		q := admission.NewQueue(admission.Config{QueueLimit: -1, BandLimit: -1})
		for i := range 200 {
			push(t, q, ticket("a"+strconv.Itoa(i), 0, "a", 10))
		}
		for range 100 {
			q.Pop(t0)
		}
		for i := range 100 {
			push(t, q, ticket("b"+strconv.Itoa(i), 0, "b", 10))
		}
		count := map[string]int{}
		for range 40 {
			tk, _ := q.Pop(t0)
			count[tk.Tenant]++
		}
		if count["a"] < 19 || count["b"] > 21 {
			t.Errorf("next 40 pops %v, want an even share", count)
		}
	})
	t.Run("idle tenant rejoins at the band's virtual time", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{})
		push(t, q, ticket("b0", 0, "b", 1))
		q.Pop(t0) // F_b = 1, V = 0
		for i := range 3 {
			push(t, q, ticket("a"+strconv.Itoa(i), 0, "a", 5))
		}
		q.Pop(t0)
		q.Pop(t0) // V = 5, F_a = 10
		push(t, q, ticket("b1", 0, "b", 1))
		if f, v := q.Finish(0, "b"); f != 5 || v != 5 {
			t.Errorf("F_b, V = %d, %d, want 5, 5", f, v)
		}
	})
}

func TestQueueLimits(t *testing.T) {
	shed := func(t *testing.T, q *admission.Queue, tk kvroute.Ticket, reason string) {
		t.Helper()
		a := q.Push(tk)
		if a.Status != kvroute.Shed || a.Reason != reason {
			t.Errorf("push %s: %v %q, want shed %q", tk.RequestID, a.Status, a.Reason, reason)
		}
	}
	t.Run("order of the checks", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{QueueLimit: 3, BandLimit: 2, TenantLimit: 1})
		push(t, q, ticket("1", 0, "a", 1))
		shed(t, q, ticket("2", 0, "a", 1), kvroute.ShedTenantFull)
		push(t, q, ticket("3", 0, "b", 1))
		shed(t, q, ticket("4", 0, "c", 1), kvroute.ShedBandFull)
		push(t, q, ticket("5", 1, "a", 1))
		shed(t, q, ticket("6", 1, "b", 1), kvroute.ShedQueueFull)
		shed(t, q, ticket("7", 0, "a", 1), kvroute.ShedQueueFull)
		if got := q.Len(); got != 3 {
			t.Errorf("len %d, want 3", got)
		}
	})
	t.Run("defaults and none", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{BandLimit: -1})
		for i := range admission.DefaultQueueLimit {
			push(t, q, ticket(strconv.Itoa(i), 0, "a", 1))
		}
		shed(t, q, ticket("x", 0, "a", 1), kvroute.ShedQueueFull)
		q = admission.NewQueue(admission.Config{QueueLimit: -1, TenantLimit: -1})
		for i := range admission.DefaultBandLimit {
			push(t, q, ticket(strconv.Itoa(i), 0, "a", 1))
		}
		shed(t, q, ticket("x", 0, "b", 1), kvroute.ShedBandFull)
		push(t, q, ticket("y", 1, "b", 1))
	})
	t.Run("the fair share keeps room for a newcomer", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{QueueLimit: -1})
		share := admission.ShareOf(admission.DefaultBandLimit, 0)
		for i := range share {
			push(t, q, ticket(strconv.Itoa(i), 0, "a", 1))
		}
		shed(t, q, ticket("x", 0, "a", 1), kvroute.ShedTenantFull)
		push(t, q, ticket("y", 0, "b", 1))
	})
	t.Run("position", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{})
		for _, tc := range []struct {
			tk   kvroute.Ticket
			want int
		}{
			{ticket("a", 0, "x", 1), 0},
			{ticket("b", 0, "y", 1), 1},
			{ticket("c", 2, "x", 1), 2},
			{ticket("d", -1, "x", 1), 0},
			{ticket("e", 1, "x", 1), 3},
			{ticket("f", 2, "z", 1), 5},
		} {
			if got := push(t, q, tc.tk).Position; got != tc.want {
				t.Errorf("push %s: position %d, want %d", tc.tk.RequestID, got, tc.want)
			}
		}
	})
	t.Run("duplicate push", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{})
		push(t, q, ticket("a", 0, "x", 1))
		push(t, q, ticket("b", 0, "x", 1))
		if got := push(t, q, ticket("a", 0, "x", 1)).Position; got != 1 {
			t.Errorf("position %d, want 1", got)
		}
		if got := q.Len(); got != 2 {
			t.Errorf("len %d, want 2", got)
		}
	})
	t.Run("counts", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{})
		push(t, q, ticket("a", 0, "x", 1))
		push(t, q, ticket("b", 0, "y", 1))
		push(t, q, ticket("c", -1, "x", 1))
		if got := fmt.Sprint(q.Bands()); got != "[-1 0]" {
			t.Errorf("bands %s, want [-1 0]", got)
		}
		if got := q.BandLen(0); got != 2 {
			t.Errorf("band 0: %d, want 2", got)
		}
		if got := q.TenantLen(-1, "x"); got != 1 {
			t.Errorf("band -1 tenant x: %d, want 1", got)
		}
		if got := q.TenantLen(3, "x"); got != 0 {
			t.Errorf("band 3 tenant x: %d, want 0", got)
		}
	})
}

func TestQueueExpiry(t *testing.T) {
	at := func(id string, d time.Duration) kvroute.Ticket {
		tk := ticket(id, 0, "a", 1)
		tk.Deadline = t0.Add(d)
		return tk
	}
	t.Run("expire sheds past the deadline only", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{})
		push(t, q, at("late", 3*time.Second))
		push(t, q, at("b", time.Second))
		push(t, q, at("a", time.Second))
		push(t, q, at("c", 2*time.Second))
		if got := q.Expire(t0.Add(time.Second)); len(got) != 0 {
			t.Errorf("at the deadline: expired %v, want none (now must pass it)", got)
		}
		var ids []string
		for _, tk := range q.Expire(t0.Add(2*time.Second + 1)) {
			ids = append(ids, tk.RequestID)
		}
		if got := fmt.Sprint(ids); got != "[b a c]" {
			t.Errorf("expired %s, want [b a c] (deadline, then push order)", got)
		}
		if got := popAll(t, q); fmt.Sprint(got) != "[late]" {
			t.Errorf("left %v, want [late]", got)
		}
	})
	t.Run("pop skips the expired", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{})
		push(t, q, at("old", time.Second))
		push(t, q, at("new", time.Minute))
		tk, ok := q.Pop(t0.Add(2 * time.Second))
		if !ok || tk.RequestID != "new" {
			t.Errorf("pop %v %v, want new", tk.RequestID, ok)
		}
		if f, _ := q.Finish(0, "a"); f != 1 {
			t.Errorf("F = %d, want 1 (the expired ticket is not charged)", f)
		}
	})
	t.Run("remove", func(t *testing.T) {
		q := admission.NewQueue(admission.Config{})
		push(t, q, ticket("a", 0, "x", 4))
		push(t, q, ticket("b", 0, "x", 4))
		push(t, q, ticket("c", 0, "y", 4))
		if !q.Remove("a") || q.Remove("a") || q.Remove("zz") {
			t.Error("remove: want true once, then false")
		}
		if f, v := q.Finish(0, "x"); f != 0 || v != 0 {
			t.Errorf("after remove F, V = %d, %d, want 0, 0", f, v)
		}
		if got := fmt.Sprint(popAll(t, q)); got != "[b c]" {
			t.Errorf("order %s, want [b c]", got)
		}
		if len(q.Expire(far.Add(time.Hour))) != 0 {
			t.Error("removed or popped tickets expired")
		}
	})
}

func BenchmarkQueue(b *testing.B) {
	for _, tenants := range []int{1, 16, 256} {
		b.Run(fmt.Sprintf("tenants=%d", tenants), func(b *testing.B) {
			q := admission.NewQueue(admission.Config{QueueLimit: -1, BandLimit: -1})
			names := make([]string, tenants)
			for i := range names {
				names[i] = "t" + strconv.Itoa(i)
			}
			ids := make([]string, 1<<16)
			for i := range ids {
				ids[i] = strconv.Itoa(i)
			}
			for i := range 1000 { // a standing backlog
				q.Push(kvroute.Ticket{RequestID: "s" + strconv.Itoa(i), Tenant: names[i%tenants], Cost: int64(1 + i%97), Deadline: far})
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				q.Push(kvroute.Ticket{RequestID: ids[i%len(ids)], Tenant: names[i%tenants], Cost: int64(1 + i%97), Deadline: far})
				if _, ok := q.Pop(t0); !ok {
					b.Fatal("empty")
				}
			}
		})
	}
}
