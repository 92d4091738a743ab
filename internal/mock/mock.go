// Package mock holds one function-field fake per consumer-side interface
// the store satisfies (router.Index, router.Registry, api.Registry), so that
// every package's tests fake the store the same way instead of each keeping
// its own hand-written copy that drifts from the others.
//
// Each method calls its Fn field and nothing else. A nil field panics when
// called, which is deliberate: a test that sets only the Fns it expects
// fails loudly on any other call. Tests that need a working store use
// NewMemory, whose Index and Registry come with every Fn wired to one
// in-memory state; a test then overrides a single Fn to inject a fault or
// observe a call, and wraps the wired one to keep the rest of the
// behaviour.
//
// The package imports router and api for the compile-time checks below.
// That is no cycle as long as only their external _test packages import
// mock; an internal test of router or api cannot.
package mock

import (
	"context"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/router"
)

// The checks fail the build, rather than a test, when an interface gains a
// method the mocks lack.
var (
	_ router.Index    = (*Index)(nil)
	_ router.Registry = (*Registry)(nil)
	_ api.Registry    = (*Registry)(nil)
)

// Index is a router.Index whose methods call their Fn fields.
type Index struct {
	LookupFn  func(ctx context.Context, model string, keys []kvroute.BlockKey, replicas []string) ([]kvroute.Overlap, []kvroute.Load, error)
	ReserveFn func(ctx context.Context, lease kvroute.Lease, ifVersion int64) (bool, kvroute.Load, error)
	// ReserveWithinFn answers ReserveWithin; nil books unconditionally
	// through ReserveFn.
	ReserveWithinFn func(ctx context.Context, lease kvroute.Lease, max kvroute.Load) (bool, kvroute.Load, error)
	// ReserveBestFn answers ReserveBest; nil books the first choice
	// unconditionally through ReserveFn.
	ReserveBestFn  func(ctx context.Context, lease kvroute.Lease, choices []kvroute.Choice, cost kvroute.ChoiceCost) (int, []kvroute.Load, error)
	RecordApproxFn func(ctx context.Context, model, replica string, keys []kvroute.BlockKey) error
	AdvanceFn      func(ctx context.Context, requestID string) (bool, error)
	ReleaseFn      func(ctx context.Context, requestID string) (bool, error)
	LoadsFn        func(ctx context.Context, model string, replicas []string) ([]kvroute.Load, error)
}

// Lookup calls LookupFn.
func (i *Index) Lookup(ctx context.Context, model string, keys []kvroute.BlockKey, replicas []string) ([]kvroute.Overlap, []kvroute.Load, error) {
	return i.LookupFn(ctx, model, keys, replicas)
}

// Reserve calls ReserveFn.
func (i *Index) Reserve(ctx context.Context, lease kvroute.Lease, ifVersion int64) (bool, kvroute.Load, error) {
	return i.ReserveFn(ctx, lease, ifVersion)
}

// ReserveBest calls ReserveBestFn, or books the first choice through
// ReserveFn unconditionally (the other choices' loads then read as zero).
func (i *Index) ReserveBest(ctx context.Context, lease kvroute.Lease, choices []kvroute.Choice, cost kvroute.ChoiceCost) (int, []kvroute.Load, error) {
	if i.ReserveBestFn != nil {
		return i.ReserveBestFn(ctx, lease, choices, cost)
	}
	lease.Replica, lease.PrefillBlocks = choices[0].Replica, choices[0].PrefillBlocks
	_, cur, err := i.ReserveFn(ctx, lease, -1)
	if err != nil {
		return -1, nil, err
	}
	loads := make([]kvroute.Load, len(choices))
	loads[0] = cur
	return 0, loads, nil
}

// ReserveWithin calls ReserveWithinFn, or ReserveFn unconditionally.
func (i *Index) ReserveWithin(ctx context.Context, lease kvroute.Lease, max kvroute.Load) (bool, kvroute.Load, error) {
	if i.ReserveWithinFn == nil {
		return i.ReserveFn(ctx, lease, -1)
	}
	return i.ReserveWithinFn(ctx, lease, max)
}

// RecordApprox calls RecordApproxFn.
func (i *Index) RecordApprox(ctx context.Context, model, replica string, keys []kvroute.BlockKey) error {
	return i.RecordApproxFn(ctx, model, replica, keys)
}

// Advance calls AdvanceFn.
func (i *Index) Advance(ctx context.Context, requestID string) (bool, error) {
	return i.AdvanceFn(ctx, requestID)
}

// Release calls ReleaseFn.
func (i *Index) Release(ctx context.Context, requestID string) (bool, error) {
	return i.ReleaseFn(ctx, requestID)
}

// Loads calls LoadsFn.
func (i *Index) Loads(ctx context.Context, model string, replicas []string) ([]kvroute.Load, error) {
	return i.LoadsFn(ctx, model, replicas)
}

// Registry is both a router.Registry and an api.Registry, because the store
// is both and the API hands the same value to the router and its admin
// endpoints. Its methods call their Fn fields.
type Registry struct {
	PutReplicaFn    func(ctx context.Context, r kvroute.Replica) error
	GetReplicaFn    func(ctx context.Context, id string) (kvroute.Replica, error)
	DeleteReplicaFn func(ctx context.Context, id string) error
	ListReplicasFn  func(ctx context.Context) ([]kvroute.Replica, error)
	StatsFn         func(ctx context.Context, model, id string) (kvroute.ReplicaStats, error)
	LoadsFn         func(ctx context.Context, model string, replicas []string) ([]kvroute.Load, error)
}

// PutReplica calls PutReplicaFn.
func (r *Registry) PutReplica(ctx context.Context, rep kvroute.Replica) error {
	return r.PutReplicaFn(ctx, rep)
}

// GetReplica calls GetReplicaFn.
func (r *Registry) GetReplica(ctx context.Context, id string) (kvroute.Replica, error) {
	return r.GetReplicaFn(ctx, id)
}

// DeleteReplica calls DeleteReplicaFn.
func (r *Registry) DeleteReplica(ctx context.Context, id string) error {
	return r.DeleteReplicaFn(ctx, id)
}

// ListReplicas calls ListReplicasFn.
func (r *Registry) ListReplicas(ctx context.Context) ([]kvroute.Replica, error) {
	return r.ListReplicasFn(ctx)
}

// Stats calls StatsFn.
func (r *Registry) Stats(ctx context.Context, model, id string) (kvroute.ReplicaStats, error) {
	return r.StatsFn(ctx, model, id)
}

// Loads calls LoadsFn.
func (r *Registry) Loads(ctx context.Context, model string, replicas []string) ([]kvroute.Load, error) {
	return r.LoadsFn(ctx, model, replicas)
}
