package mock_test

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/mock"
)

// TestMemory pins the store semantics the router's and the API's tests
// lean on, so that a change here shows up as this test failing rather than
// as a puzzling failure in theirs.
func TestMemory(t *testing.T) {
	ctx := context.Background()
	keys := []kvroute.BlockKey{1, 2, 3}

	t.Run("prefix match per tier", func(t *testing.T) {
		mem := mock.NewMemory()
		idx := mem.Index()
		mem.Hold("a", keys[:2])
		if err := idx.RecordApprox(ctx, "m", "b", []kvroute.BlockKey{1, 3}); err != nil {
			t.Fatal(err)
		}
		ov, _, err := idx.Lookup(ctx, "m", keys, []string{"a", "b"})
		if err != nil {
			t.Fatal(err)
		}
		want := []kvroute.Overlap{{GPU: 2, Any: 2}, {Approx: 1}}
		if !slices.Equal(ov, want) {
			t.Errorf("overlaps = %+v, want %+v", ov, want)
		}
	})

	t.Run("lease lifecycle", func(t *testing.T) {
		mem := mock.NewMemory()
		idx := mem.Index()
		lease := kvroute.Lease{RequestID: "q", Replica: "a", PrefillBlocks: 4, DecodeBlocks: 2}
		if ok, _, err := idx.Reserve(ctx, lease, 1); ok || err != nil {
			t.Fatalf("reserve at a stale version: booked=%v err=%v, want refused", ok, err)
		}
		if ok, _, err := idx.Reserve(ctx, lease, 0); !ok || err != nil {
			t.Fatalf("reserve: booked=%v err=%v, want booked", ok, err)
		}
		for range 2 { // a repeated first token moves the prefill once
			if ok, err := idx.Advance(ctx, "q"); !ok || err != nil {
				t.Fatalf("advance: found=%v err=%v", ok, err)
			}
		}
		if got, want := mem.Load("a"), (kvroute.Load{DecodeBlocks: 2, Requests: 1, Version: 2}); got != want {
			t.Errorf("load after advance = %+v, want %+v", got, want)
		}
		if ok, err := idx.Release(ctx, "q"); !ok || err != nil {
			t.Fatalf("release: found=%v err=%v", ok, err)
		}
		if ok, _ := idx.Release(ctx, "q"); ok {
			t.Error("second release found the lease")
		}
		if got := mem.Load("a"); got.PrefillBlocks != 0 || got.DecodeBlocks != 0 || got.Requests != 0 {
			t.Errorf("load after release = %+v, want zero", got)
		}
		want := []string{"advance q", "advance q", "release q", "release q"}
		if got := mem.Calls(); !slices.Equal(got, want) {
			t.Errorf("calls = %v, want %v", got, want)
		}
	})

	t.Run("down fails every call", func(t *testing.T) {
		mem := mock.NewMemory(kvroute.Replica{ID: "a", Model: "m"})
		idx, reg := mem.Index(), mem.Registry()
		mem.SetDown(true)
		for name, call := range map[string]func() error{
			"Lookup":  func() error { _, _, err := idx.Lookup(ctx, "m", keys, []string{"a"}); return err },
			"Reserve": func() error { _, _, err := idx.Reserve(ctx, kvroute.Lease{Replica: "a"}, -1); return err },
			"ReserveWithin": func() error {
				_, _, err := idx.ReserveWithin(ctx, kvroute.Lease{Replica: "a"}, kvroute.Load{Requests: 9})
				return err
			},
			"RecordApprox":  func() error { return idx.RecordApprox(ctx, "m", "a", keys) },
			"Advance":       func() error { _, err := idx.Advance(ctx, "q"); return err },
			"Release":       func() error { _, err := idx.Release(ctx, "q"); return err },
			"PutReplica":    func() error { return reg.PutReplica(ctx, kvroute.Replica{ID: "b"}) },
			"GetReplica":    func() error { _, err := reg.GetReplica(ctx, "a"); return err },
			"DeleteReplica": func() error { return reg.DeleteReplica(ctx, "a") },
			"ListReplicas":  func() error { _, err := reg.ListReplicas(ctx); return err },
			"Stats":         func() error { _, err := reg.Stats(ctx, "m", "a"); return err },
			"Loads":         func() error { _, err := reg.Loads(ctx, "m", []string{"a"}); return err },
		} {
			if err := call(); !errors.Is(err, kvroute.ErrUnavailable) {
				t.Errorf("%s: err = %v, want ErrUnavailable", name, err)
			}
		}
		mem.SetDown(false)
		if _, err := reg.GetReplica(ctx, "a"); err != nil {
			t.Errorf("after coming back: %v", err)
		}
	})

	t.Run("registry", func(t *testing.T) {
		mem := mock.NewMemory(kvroute.Replica{ID: "b"}, kvroute.Replica{ID: "a"})
		reg := mem.Registry()
		list, err := reg.ListReplicas(ctx)
		if err != nil || len(list) != 2 || list[0].ID != "a" || list[1].ID != "b" {
			t.Errorf("list = %+v, %v; want a, b sorted by id", list, err)
		}
		if err := reg.DeleteReplica(ctx, "a"); err != nil {
			t.Fatal(err)
		}
		if _, err := reg.GetReplica(ctx, "a"); !errors.Is(err, kvroute.ErrNotFound) {
			t.Errorf("get after delete: err = %v, want ErrNotFound", err)
		}
		if err := reg.DeleteReplica(ctx, "a"); !errors.Is(err, kvroute.ErrNotFound) {
			t.Errorf("second delete: err = %v, want ErrNotFound", err)
		}
	})

	t.Run("an overridden Fn leaves the others wired", func(t *testing.T) {
		mem := mock.NewMemory(kvroute.Replica{ID: "a"})
		reg := mem.Registry()
		reg.GetReplicaFn = func(context.Context, string) (kvroute.Replica, error) {
			return kvroute.Replica{}, errors.New("injected")
		}
		if _, err := reg.GetReplica(ctx, "a"); err == nil || err.Error() != "injected" {
			t.Errorf("overridden GetReplica: err = %v, want injected", err)
		}
		if list, err := reg.ListReplicas(ctx); err != nil || len(list) != 1 {
			t.Errorf("ListReplicas = %+v, %v; want the one replica", list, err)
		}
		if _, err := mem.Registry().GetReplica(ctx, "a"); err != nil {
			t.Errorf("a fresh Registry saw the override: %v", err)
		}
	})
}
