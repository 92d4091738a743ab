package store_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/store"
)

// admitLease is a booking under admission.
func admitLease(id, replica string, exp time.Time) kvroute.Lease {
	l := lease(id, replica, 1, 1, exp)
	l.Admit = true
	return l
}

// oneEach is a fleet of replicas that take one request each.
func oneEach(replicas ...string) kvroute.Capacity {
	c := kvroute.Capacity{Replicas: map[string]kvroute.Limits{}, BlockSize: 16}
	for _, r := range replicas {
		c.Replicas[r] = kvroute.Limits{MaxRequests: 1}
	}
	return c
}

func ticket(e *env, id, tenant string, prio int, cost int64) kvroute.Ticket {
	return kvroute.Ticket{RequestID: rid(id), Model: mdl, Pod: "pod1", Priority: prio, Tenant: tenant, Cost: cost,
		Deadline: e.clk.Now().Add(time.Minute)}
}

func enqueue(t *testing.T, e *env, tk kvroute.Ticket) kvroute.Admission {
	t.Helper()
	a, err := e.s.Enqueue(context.Background(), tk, 10*time.Second, kvroute.QueueLimits{})
	if err != nil {
		t.Fatalf("enqueue %s: %v", tk.RequestID, err)
	}
	return a
}

func setCap(t *testing.T, e *env, c kvroute.Capacity) {
	t.Helper()
	if err := e.s.SetCapacity(context.Background(), mdl, c); err != nil {
		t.Fatal(err)
	}
}

func TestAdmission(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		exp := e.clk.Now().Add(time.Minute)
		setCap(t, e, oneEach("a", "b"))
		grants, err := e.s.Grants(ctx, "pod1")
		if err != nil {
			t.Fatal(err)
		}
		t.Run("a booking takes a replica with room only", func(t *testing.T) {
			if ok, _, err := e.s.Reserve(ctx, admitLease("r1", "a", exp), -1); !ok || err != nil {
				t.Fatalf("first booking on a = %v, %v; want booked", ok, err)
			}
			if _, _, err := e.s.Reserve(ctx, admitLease("r2", "a", exp), -1); !errors.Is(err, kvroute.ErrNoRoom) {
				t.Fatalf("second booking on full a: err = %v, want ErrNoRoom", err)
			}
			choices := []kvroute.Choice{{Replica: "a", PrefillBlocks: 1}, {Replica: "b", PrefillBlocks: 1}}
			j, _, err := e.s.ReserveBest(ctx, admitLease("r2", "a", exp), choices, kvroute.ChoiceCost{PrefillScale: 1, Bound: 1e9})
			if err != nil || j != 1 {
				t.Fatalf("settled booking = %d, %v; want choice 1 (b, the one with room)", j, err)
			}
			if _, _, err := e.s.ReserveBest(ctx, admitLease("r3", "a", exp), choices, kvroute.ChoiceCost{PrefillScale: 1, Bound: 1e9}); !errors.Is(err, kvroute.ErrNoRoom) {
				t.Fatalf("settled booking on a full fleet: err = %v, want ErrNoRoom", err)
			}
			// Outside admission the booking goes where it is told.
			if ok, _, err := e.s.Reserve(ctx, lease("free", "a", 1, 1, exp), -1); !ok || err != nil {
				t.Fatalf("booking without admission = %v, %v; want booked", ok, err)
			}
			if ok, _ := e.s.Release(ctx, rid("free")); !ok {
				t.Fatal("release of the booking without admission = false")
			}
		})
		t.Run("a release grants the queue's head a seat", func(t *testing.T) {
			if a := enqueue(t, e, ticket(e, "q1", "t", 0, 10)); a.Status != kvroute.Queued || a.Position != 0 {
				t.Fatalf("enqueue q1 = %+v, want queued at 0", a)
			}
			if a := enqueue(t, e, ticket(e, "q2", "t", 0, 10)); a.Status != kvroute.Queued || a.Position != 1 {
				t.Fatalf("enqueue q2 = %+v, want queued at 1", a)
			}
			if d, _ := e.s.QueueDepth(ctx, mdl); d != 2 {
				t.Errorf("depth = %d, want 2", d)
			}
			// A fresh request does not pass the queue, even where a
			// replica has room: it queues too.
			if ok, _ := e.s.Release(ctx, rid("r1")); !ok {
				t.Fatal("release r1 = false")
			}
			g := wait.Recv(t, "a grant", grants)
			if g.RequestID != rid("q1") || g.Replica != "a" {
				t.Fatalf("grant = %+v, want q1 on a", g)
			}
			if _, _, err := e.s.Reserve(ctx, admitLease("late", "a", exp), -1); !errors.Is(err, kvroute.ErrNoRoom) {
				t.Fatalf("fresh booking past a queue: err = %v, want ErrNoRoom", err)
			}
			// The granted request books its seat, on a.
			if ok, _, err := e.s.Reserve(ctx, admitLease("q1", "a", exp), -1); !ok || err != nil {
				t.Fatalf("granted booking = %v, %v; want booked", ok, err)
			}
			if got := loadOf(t, e, "a").Requests; got != 1 {
				t.Errorf("a's requests after the seat was taken = %d, want 1", got)
			}
		})
		t.Run("a seat given back admits the next", func(t *testing.T) {
			if ok, _ := e.s.Release(ctx, rid("r2")); !ok {
				t.Fatal("release r2 = false")
			}
			g := wait.Recv(t, "a grant", grants)
			if g.RequestID != rid("q2") || g.Replica != "b" {
				t.Fatalf("grant = %+v, want q2 on b", g)
			}
			if a := enqueue(t, e, ticket(e, "q3", "t", 0, 10)); a.Status != kvroute.Queued {
				t.Fatalf("enqueue q3 = %+v, want queued", a)
			}
			// q2's client left: its seat goes to q3.
			if n, err := e.s.Dequeue(ctx, rid("q2")); n != 2 || err != nil {
				t.Fatalf("dequeue of a granted request = %d, %v; want 2", n, err)
			}
			if g := wait.Recv(t, "a grant", grants); g.RequestID != rid("q3") || g.Replica != "b" {
				t.Fatalf("grant = %+v, want q3 on b", g)
			}
			// An unbooked seat expires, and the sweep gives it back.
			if a := enqueue(t, e, ticket(e, "q4", "t", 0, 10)); a.Status != kvroute.Queued {
				t.Fatalf("enqueue q4 = %+v, want queued", a)
			}
			e.clk.Add(3 * time.Second)
			if _, err := e.s.SweepExpired(ctx, mdl); err != nil {
				t.Fatal(err)
			}
			if g := wait.Recv(t, "a grant", grants); g.RequestID != rid("q4") || g.Replica != "b" {
				t.Fatalf("grant after the sweep = %+v, want q4 on b", g)
			}
			depth, st, err := e.s.Kick(ctx, mdl, 10*time.Second, []string{rid("q4"), rid("q3")})
			if err != nil || depth != 0 || st[0].Replica != "b" || st[1] != (kvroute.TicketState{}) {
				t.Fatalf("kick = %d, %+v, %v; want depth 0, q4 granted on b, q3 gone", depth, st, err)
			}
			if ok, _, err := e.s.Reserve(ctx, admitLease("q4", "b", e.clk.Now().Add(time.Minute)), -1); !ok || err != nil {
				t.Fatalf("q4's booking = %v, %v; want booked", ok, err)
			}
		})
		t.Run("a ticket its pod stops renewing leaves the queue", func(t *testing.T) {
			if a := enqueue(t, e, ticket(e, "q5", "t", 0, 10)); a.Status != kvroute.Queued {
				t.Fatalf("enqueue q5 = %+v, want queued", a)
			}
			e.clk.Add(5 * time.Second)
			if _, st, _ := e.s.Kick(ctx, mdl, 10*time.Second, []string{rid("q5")}); !st[0].Queued {
				t.Fatalf("q5 after a renewal = %+v, want queued", st[0])
			}
			e.clk.Add(11 * time.Second)
			depth, st, err := e.s.Kick(ctx, mdl, 10*time.Second, nil)
			if err != nil || depth != 0 || len(st) != 0 {
				t.Fatalf("kick = %d, %v, %v; want an empty queue", depth, st, err)
			}
			if d, _ := e.s.QueueDepth(ctx, mdl); d != 0 {
				t.Errorf("depth list = %d, want 0", d)
			}
		})
	})
}

// TestAdmissionLimits covers the queue's own limits and the fleet's.
func TestAdmissionLimits(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		exp := e.clk.Now().Add(time.Minute)
		c := oneEach("a", "b")
		c.MaxInFlight = 1
		setCap(t, e, c)
		t.Run("fleet max", func(t *testing.T) {
			if ok, _, err := e.s.Reserve(ctx, admitLease("f1", "a", exp), -1); !ok || err != nil {
				t.Fatalf("first booking = %v, %v", ok, err)
			}
			if _, _, err := e.s.Reserve(ctx, admitLease("f2", "b", exp), -1); !errors.Is(err, kvroute.ErrNoRoom) {
				t.Fatalf("booking past the fleet's max: err = %v, want ErrNoRoom", err)
			}
		})
		t.Run("shed", func(t *testing.T) {
			lim := kvroute.QueueLimits{Queue: 3, Band: 2, Tenant: 1}
			for _, tc := range []struct {
				id, tenant string
				prio       int
				want       kvroute.AdmitStatus
				reason     string
			}{
				{"s1", "x", 0, kvroute.Queued, ""},
				{"s2", "x", 0, kvroute.Shed, kvroute.ShedTenantFull},
				{"s3", "y", 0, kvroute.Queued, ""},
				{"s4", "z", 0, kvroute.Shed, kvroute.ShedBandFull},
				{"s5", "z", 1, kvroute.Queued, ""},
				{"s6", "w", 2, kvroute.Shed, kvroute.ShedQueueFull},
			} {
				a, err := e.s.Enqueue(ctx, ticket(e, tc.id, tc.tenant, tc.prio, 1), time.Minute, lim)
				if err != nil || a.Status != tc.want || a.Reason != tc.reason {
					t.Errorf("enqueue %s = %+v, %v; want status %d, reason %q", tc.id, a, err, tc.want, tc.reason)
				}
			}
			if _, err := e.s.Enqueue(ctx, ticket(e, "s1", "x", 0, 1), time.Minute, lim); !errors.Is(err, store.ErrAlreadyQueued) {
				t.Errorf("enqueue of a queued id: err = %v, want ErrAlreadyQueued", err)
			}
		})
	})
}

// TestAdmissionOrder holds the queue to its dispatch order: bands first,
// then tenants by their charge, then FCFS.
func TestAdmissionOrder(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		exp := e.clk.Now().Add(time.Minute)
		setCap(t, e, oneEach("a"))
		grants, err := e.s.Grants(ctx, "pod1")
		if err != nil {
			t.Fatal(err)
		}
		if ok, _, err := e.s.Reserve(ctx, admitLease("hold", "a", exp), -1); !ok || err != nil {
			t.Fatalf("booking = %v, %v", ok, err)
		}
		// Tenant cheap's requests cost 1, dear's 3: after the high band,
		// cheap is served three for each of dear's.
		for _, tk := range []kvroute.Ticket{
			ticket(e, "d1", "dear", 0, 3), ticket(e, "d2", "dear", 0, 3), ticket(e, "c1", "cheap", 0, 1),
			ticket(e, "c2", "cheap", 0, 1), ticket(e, "c3", "cheap", 0, 1), ticket(e, "c4", "cheap", 0, 1),
			ticket(e, "h1", "dear", -1, 50),
		} {
			enqueue(t, e, tk)
		}
		want := []string{"h1", "c1", "d1", "c2", "c3", "c4", "d2"}
		prev := "hold"
		for i, w := range want {
			if ok, _ := e.s.Release(ctx, rid(prev)); !ok {
				t.Fatalf("release %s = false", prev)
			}
			g := wait.Recv(t, "grant "+w, grants)
			if g.RequestID != rid(w) {
				t.Fatalf("grant %d = %s, want %s", i, g.RequestID, rid(w))
			}
			if ok, _, err := e.s.Reserve(ctx, admitLease(w, "a", exp), -1); !ok || err != nil {
				t.Fatalf("booking of %s = %v, %v", w, ok, err)
			}
			prev = w
		}
	})
}

// TestQueueMatchesReference holds the store's Lua queue to
// admission.Queue, the reference: random pushes (three bands, four
// tenants, random costs), removals and dispatches must give the same
// positions and admit the same requests in the same order.
func TestQueueMatchesReference(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		exp := e.clk.Now().Add(time.Hour)
		setCap(t, e, oneEach("a"))
		ref := admission.NewQueue(admission.Config{QueueLimit: -1, BandLimit: -1, TenantLimit: -1})
		rng := rand.New(rand.NewPCG(20, 20))
		if ok, _, err := e.s.Reserve(ctx, admitLease("holder0", "a", exp), -1); !ok || err != nil {
			t.Fatalf("booking = %v, %v", ok, err)
		}
		holder := rid("holder0")
		var queued []string
		tenants := []string{"", "alpha", "beta", "gamma"}
		for step := range 600 {
			switch op := rng.IntN(10); {
			case op < 5 || len(queued) == 0:
				tk := ticket(e, fmt.Sprintf("t%d", step), tenants[rng.IntN(len(tenants))], rng.IntN(3)-1, int64(1+rng.IntN(100)))
				tk.Deadline = e.clk.Now().Add(time.Hour)
				want := ref.Push(tk)
				got := enqueue(t, e, tk)
				if got.Status != want.Status || got.Position != want.Position {
					t.Fatalf("step %d: push %+v = %+v, reference %+v", step, tk, got, want)
				}
				queued = append(queued, tk.RequestID)
			case op < 6:
				i := rng.IntN(len(queued))
				id := queued[i]
				queued = append(queued[:i], queued[i+1:]...)
				ref.Remove(id)
				if n, err := e.s.Dequeue(ctx, id); n != 1 || err != nil {
					t.Fatalf("step %d: dequeue %s = %d, %v; want 1", step, id, n, err)
				}
			default:
				want, ok := ref.Pop(e.clk.Now())
				if !ok {
					t.Fatalf("step %d: the reference is empty with %d queued", step, len(queued))
				}
				if ok, _ := e.s.Release(ctx, holder); !ok {
					t.Fatalf("step %d: release of the holder = false", step)
				}
				_, st, err := e.s.Kick(ctx, mdl, time.Hour, []string{want.RequestID})
				if err != nil || st[0].Replica != "a" {
					t.Fatalf("step %d: the store did not admit %s, the reference's next (%+v, %v)", step, want.RequestID, st, err)
				}
				l := admitLease("", "a", exp)
				l.RequestID = want.RequestID
				if ok, _, err := e.s.Reserve(ctx, l, -1); !ok || err != nil {
					t.Fatalf("step %d: booking of the seat = %v, %v", step, ok, err)
				}
				holder = want.RequestID
				queued = slices.DeleteFunc(queued, func(id string) bool { return id == want.RequestID })
			}
		}
		if d, _ := e.s.QueueDepth(ctx, mdl); int(d) != ref.Len() {
			t.Errorf("depth = %d, reference %d", d, ref.Len())
		}
	})
}

// TestTenantFairShare: with no fixed tenant limit a tenant holds at most
// its fair share of a band, which keeps room for a newcomer, in the store
// as in admission.Queue.
func TestTenantFairShare(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		ctx := context.Background()
		setCap(t, e, oneEach())
		ref := admission.NewQueue(admission.Config{QueueLimit: -1, BandLimit: 4})
		lim := kvroute.QueueLimits{Band: 4, FairShare: true}
		push := func(id, tenant string) kvroute.Admission {
			t.Helper()
			tk := ticket(e, id, tenant, 0, 1)
			got, err := e.s.Enqueue(ctx, tk, time.Minute, lim)
			if err != nil {
				t.Fatal(err)
			}
			if want := ref.Push(tk); got.Status != want.Status || got.Reason != want.Reason {
				t.Fatalf("push %s = %+v, reference %+v", id, got, want)
			}
			return got
		}
		// Alone in the band, heavy may hold half of it: room stays
		// for one more tenant.
		for i, want := range []string{"", "", kvroute.ShedTenantFull} {
			if a := push(fmt.Sprintf("a%d", i), "heavy"); a.Reason != want {
				t.Fatalf("heavy's %d = %+v, want reason %q", i, a, want)
			}
		}
		if a := push("b0", "light"); a.Status != kvroute.Queued {
			t.Fatalf("light beside heavy = %+v, want queued", a)
		}
		// With light backlogged, each holds at most ceil(4/3) = 2.
		if a := push("b1", "light"); a.Status != kvroute.Queued {
			t.Fatalf("light's second = %+v, want queued", a)
		}
		if a := push("b2", "light"); a.Reason != kvroute.ShedBandFull {
			t.Fatalf("light into the full band = %+v, want band_full", a)
		}
	})
}
