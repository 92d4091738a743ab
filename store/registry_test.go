package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
)

func TestRegistry(t *testing.T) {
	ctx := context.Background()
	forBackends(t, func(t *testing.T, e *env) {
		version := func() int64 {
			t.Helper()
			v, err := e.s.RegistryVersion(ctx)
			if err != nil {
				t.Fatal(err)
			}
			return v
		}
		v0 := version()
		b := kvroute.Replica{ID: "b", Model: mdl, URL: "http://b:8000", Events: "tcp://b:5557"}
		a := kvroute.Replica{ID: "a", Model: mdl, URL: "http://a:8000"}
		for _, r := range []kvroute.Replica{b, a} {
			if err := e.s.PutReplica(ctx, r); err != nil {
				t.Fatal(err)
			}
		}
		if err := e.s.PutReplica(ctx, kvroute.Replica{ID: "bad id"}); !errors.Is(err, kvroute.ErrInvalidInput) {
			t.Errorf("put invalid = %v, want ErrInvalidInput", err)
		}
		if v := version(); v != v0+2 {
			t.Errorf("version = %d, want %d", v, v0+2)
		}
		list, err := e.s.ListReplicas(ctx)
		if err != nil || len(list) != 2 || list[0].ID != "a" || list[1].Events != b.Events {
			t.Errorf("list = %+v, %v; want a, b", list, err)
		}
		at := time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)
		if err := e.s.SetHealth(ctx, "b", kvroute.HealthUnhealthy, at); err != nil {
			t.Fatal(err)
		}
		got, err := e.s.GetReplica(ctx, "b")
		if err != nil || got.Health != kvroute.HealthUnhealthy || !got.Checked.Equal(at) || got.Routable() {
			t.Errorf("get after set health = %+v, %v", got, err)
		}
		if v := version(); v != v0+3 {
			t.Errorf("version after health change = %d, want %d", v, v0+3)
		}
		if err := e.s.SetHealth(ctx, "nope", kvroute.HealthHealthy, at); !errors.Is(err, kvroute.ErrNotFound) {
			t.Errorf("set health of unknown = %v, want ErrNotFound", err)
		}
		if _, err := e.s.GetReplica(ctx, "nope"); !errors.Is(err, kvroute.ErrNotFound) {
			t.Errorf("get unknown = %v, want ErrNotFound", err)
		}

		// A reported block size is kept; only a change moves the version.
		for range 2 {
			if err := e.s.SetBlockSize(ctx, "b", 32); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := e.s.GetReplica(ctx, "b"); err != nil || got.BlockSize != 32 || got.Health != kvroute.HealthUnhealthy {
			t.Errorf("get after set block size = %+v, %v; want block size 32, health kept", got, err)
		}
		if v := version(); v != v0+4 {
			t.Errorf("version after block size change = %d, want %d", v, v0+4)
		}
		for _, bad := range []int{0, -1, kvroute.MaxBlockSize + 1} {
			if err := e.s.SetBlockSize(ctx, "b", bad); !errors.Is(err, kvroute.ErrInvalidInput) {
				t.Errorf("set block size %d = %v, want ErrInvalidInput", bad, err)
			}
		}
		if err := e.s.SetBlockSize(ctx, "nope", 16); !errors.Is(err, kvroute.ErrNotFound) {
			t.Errorf("set block size of unknown = %v, want ErrNotFound", err)
		}

		// Deleting a replica purges its state too.
		k := []kvroute.BlockKey{1, 2}
		if _, err := e.s.Apply(ctx, mdl, "b", 1, storeChain(k, 0, 2, kvroute.TierGPU)); err != nil {
			t.Fatal(err)
		}
		if err := e.s.DeleteReplica(ctx, "b"); err != nil {
			t.Fatal(err)
		}
		if err := e.s.DeleteReplica(ctx, "b"); !errors.Is(err, kvroute.ErrNotFound) {
			t.Errorf("second delete = %v, want ErrNotFound", err)
		}
		ov, _, err := e.s.Lookup(ctx, mdl, k, []string{"b"})
		if err != nil || ov[0] != (kvroute.Overlap{}) {
			t.Errorf("lookup after delete = %+v, %v; want zero", ov, err)
		}
		if v := version(); v != v0+5 {
			t.Errorf("version after delete = %d, want %d", v, v0+5)
		}
	})
}

func TestOwnership(t *testing.T) {
	ctx := context.Background()
	forBackends(t, func(t *testing.T, e *env) {
		steps := []struct {
			name, owner string
			release     bool
			want        bool
		}{
			{"first owner takes it", "i1", false, true},
			{"other owner refused", "i2", false, false},
			{"owner renews", "i1", false, true},
			{"other owner's release ignored", "i2", true, false},
			{"still refused", "i2", false, false},
			{"owner releases", "i1", true, false},
			{"other owner takes it", "i2", false, true},
		}
		for _, st := range steps {
			if st.release {
				if err := e.s.ReleaseOwnership(ctx, "replica/x", st.owner); err != nil {
					t.Fatalf("%s: %v", st.name, err)
				}
				continue
			}
			got, err := e.s.Acquire(ctx, "replica/x", st.owner, time.Minute)
			if err != nil || got != st.want {
				t.Errorf("%s: acquire = %v, %v; want %v", st.name, got, err, st.want)
			}
		}
	})
}

// A data-parallel replica's loads and leases are kept under its engines'
// IDs; deleting the replica (by hand, or discovery's purge) must release
// them too, or its bookings would outlive it.
func TestDeleteDataParallelReplica(t *testing.T) {
	ctx := context.Background()
	forBackends(t, func(t *testing.T, e *env) {
		dp := kvroute.Replica{ID: "dp", Model: mdl, URL: "http://dp:8000", Events: "tcp://dp:5557", DataParallelSize: 2}
		del := map[string]func() error{
			"DeleteReplica": func() error { return e.s.DeleteReplica(ctx, "dp") },
			"DeleteReplicaIf": func() error {
				ok, err := e.s.DeleteReplicaIf(ctx, "dp", func(kvroute.Replica) bool { return true })
				if err == nil && !ok {
					t.Error("DeleteReplicaIf did not delete")
				}
				return err
			},
		}
		for name, fn := range del {
			t.Run(name, func(t *testing.T) {
				if err := e.s.PutReplica(ctx, dp); err != nil {
					t.Fatal(err)
				}
				exp := e.clk.Now().Add(time.Minute)
				for _, eng := range dp.Engines() {
					if ok, _, err := e.s.Reserve(ctx, lease(name+eng.ID, eng.ID, 3, 2, exp), -1); err != nil || !ok {
						t.Fatalf("reserve on %s: %v, %v", eng.ID, ok, err)
					}
				}
				if err := fn(); err != nil {
					t.Fatal(err)
				}
				for _, eng := range dp.Engines() {
					if l := loadOf(t, e, eng.ID); l.PrefillBlocks != 0 || l.DecodeBlocks != 0 || l.Requests != 0 {
						t.Errorf("%s's load after delete = %+v, want none", eng.ID, l)
					}
				}
			})
		}
	})
}
