package mock

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/scoring"
)

// Memory is an in-memory stand-in for the Redis store, kept once here so
// that the router's and the API's tests agree on what the store does. It
// keeps just enough semantics for behaviour to be observable through the
// interfaces: prefix matching over the keys each replica holds (event-fed)
// or was sent (approximate), versioned loads booked by leases, the order
// of progress reports, a replica registry, and a switch that takes the
// whole store down. Models are not kept apart: a replica serves one model,
// and tests key each replica's blocks by replica alone.
//
// It is safe for concurrent use, since the API's tests drive it from an
// HTTP server's goroutines while the test reads it.
type Memory struct {
	mu       sync.Mutex
	replicas map[string]kvroute.Replica
	held     map[string]map[kvroute.BlockKey]bool // GPU tier, as events report it
	approx   map[string]map[kvroute.BlockKey]bool // what decisions sent
	loads    map[string]kvroute.Load
	leases   map[string]kvroute.Lease
	advanced map[string]bool // request ids whose prefill moved to decode
	down     bool
	calls    []string // "advance <id>", "release <id>", in order
}

// NewMemory returns an empty store with replicas registered. Seeding here
// rather than through PutReplica keeps test setup free of error checks.
func NewMemory(replicas ...kvroute.Replica) *Memory {
	m := &Memory{
		replicas: map[string]kvroute.Replica{},
		held:     map[string]map[kvroute.BlockKey]bool{},
		approx:   map[string]map[kvroute.BlockKey]bool{},
		loads:    map[string]kvroute.Load{},
		leases:   map[string]kvroute.Lease{},
		advanced: map[string]bool{},
	}
	for _, r := range replicas {
		m.replicas[r.ID] = r
	}
	return m
}

// Index returns a new router.Index over m with every Fn wired. Each call
// returns a fresh value, so that overriding an Fn on one does not change
// what another consumer of m sees.
func (m *Memory) Index() *Index {
	return &Index{
		LookupFn:        m.lookup,
		ReserveFn:       m.reserve,
		ReserveWithinFn: m.reserveWithin,
		ReserveBestFn:   m.reserveBest,
		RecordApproxFn:  m.recordApprox,
		AdvanceFn:       m.advance,
		ReleaseFn:       m.release,
		LoadsFn:         m.listLoads,
	}
}

// Registry returns a new router.Registry and api.Registry over m with every
// Fn wired; as with Index, each call returns a fresh value.
func (m *Memory) Registry() *Registry {
	return &Registry{
		PutReplicaFn:    m.putReplica,
		GetReplicaFn:    m.getReplica,
		DeleteReplicaFn: m.deleteReplica,
		ListReplicasFn:  m.listReplicas,
		StatsFn:         m.stats,
		LoadsFn:         m.listLoads,
	}
}

// SetDown takes the store down or brings it back. While it is down every
// call fails with an error wrapping kvroute.ErrUnavailable, which is what
// the store returns when Redis cannot be reached and what sends the router
// into its degraded mode.
func (m *Memory) SetDown(down bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.down = down
}

// Hold records that replica holds keys on the GPU, as its KV-cache events
// would have told the ingestor.
func (m *Memory) Hold(replica string, keys []kvroute.BlockKey) {
	m.mu.Lock()
	defer m.mu.Unlock()
	addKeys(m.held, replica, keys)
}

// Load returns the load booked on replica (zero when nothing was).
func (m *Memory) Load(replica string) kvroute.Load {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.loads[replica]
}

// SetLoad replaces the load booked on replica, version included, as
// another router pod or the engine's own reports would.
func (m *Memory) SetLoad(replica string, l kvroute.Load) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.loads[replica] = l
}

// Lease returns the lease booked for a request, if it is still held.
func (m *Memory) Lease(requestID string) (kvroute.Lease, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l, ok := m.leases[requestID]
	return l, ok
}

// Calls returns the progress reports the store accepted, "advance <id>" or
// "release <id>", in the order they arrived, so that tests can check a
// proxied request reports its first token before its end.
func (m *Memory) Calls() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.calls)
}

// unavailable is the error every call returns while the store is down. It
// is called with m.mu held.
func (m *Memory) unavailable() error {
	if m.down {
		return fmt.Errorf("mock: store down: %w", kvroute.ErrUnavailable)
	}
	return nil
}

func (m *Memory) lookup(_ context.Context, _ string, keys []kvroute.BlockKey, replicas []string) ([]kvroute.Overlap, []kvroute.Load, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unavailable(); err != nil {
		return nil, nil, err
	}
	ov := make([]kvroute.Overlap, len(replicas))
	ld := make([]kvroute.Load, len(replicas))
	for i, id := range replicas {
		n := lead(m.held[id], keys)
		ov[i] = kvroute.Overlap{GPU: n, Any: n, Approx: lead(m.approx[id], keys)}
		ld[i] = m.loads[id]
	}
	return ov, ld, nil
}

// reserve books the lease only if the replica's version is still ifVersion
// (any when negative), as the store's compare-and-book does; a refusal
// returns the current load so the router can re-score.
func (m *Memory) reserve(ctx context.Context, l kvroute.Lease, ifVersion int64) (bool, kvroute.Load, error) {
	return m.book(ctx, l, ifVersion, nil)
}

func (m *Memory) reserveWithin(ctx context.Context, l kvroute.Lease, max kvroute.Load) (bool, kvroute.Load, error) {
	return m.book(ctx, l, -1, &max)
}

// book is the store's reserve.lua: by version, or within bounds.
func (m *Memory) book(_ context.Context, l kvroute.Lease, ifVersion int64, within *kvroute.Load) (bool, kvroute.Load, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unavailable(); err != nil {
		return false, kvroute.Load{}, err
	}
	cur := m.loads[l.Replica]
	switch {
	case within != nil:
		if cur.PrefillBlocks > within.PrefillBlocks || cur.DecodeBlocks > within.DecodeBlocks || cur.Requests > within.Requests {
			return false, cur, nil
		}
	case ifVersion >= 0 && ifVersion != cur.Version:
		return false, cur, nil
	}
	cur.PrefillBlocks += l.PrefillBlocks
	cur.DecodeBlocks += l.DecodeBlocks
	cur.Requests++
	cur.Version++
	m.loads[l.Replica] = cur
	m.leases[l.RequestID] = l
	return true, cur, nil
}

// reserveBest is the store's reservebest.lua: the choice scoring.Settled
// settles on by the loads as they are (the same Go the router scores
// with, not a copy of it).
func (m *Memory) reserveBest(_ context.Context, l kvroute.Lease, choices []kvroute.Choice, c kvroute.ChoiceCost) (int, []kvroute.Load, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unavailable(); err != nil {
		return -1, nil, err
	}
	loads := make([]kvroute.Load, len(choices))
	for j, ch := range choices {
		loads[j] = m.loads[ch.Replica]
	}
	if held, ok := m.leases[l.RequestID]; ok {
		for j, ch := range choices {
			if ch.Replica == held.Replica {
				return j, loads, nil
			}
		}
		return -1, loads, nil
	}
	best := scoring.Settled(c, choices, loads)
	if best < 0 {
		return -1, loads, nil
	}
	cur := loads[best]
	cur.PrefillBlocks += choices[best].PrefillBlocks
	cur.DecodeBlocks += l.DecodeBlocks
	cur.Requests++
	cur.Version++
	m.loads[choices[best].Replica] = cur
	loads[best] = cur
	l.Replica, l.PrefillBlocks = choices[best].Replica, choices[best].PrefillBlocks
	m.leases[l.RequestID] = l
	return best, loads, nil
}

func (m *Memory) recordApprox(_ context.Context, _, replica string, keys []kvroute.BlockKey) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unavailable(); err != nil {
		return err
	}
	addKeys(m.approx, replica, keys)
	return nil
}

// advance moves a lease's prefill off its replica, once: a repeated first
// token report finds the lease but books nothing.
func (m *Memory) advance(_ context.Context, id string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unavailable(); err != nil {
		return false, err
	}
	m.calls = append(m.calls, "advance "+id)
	l, ok := m.leases[id]
	if ok && !m.advanced[id] {
		m.advanced[id] = true
		cur := m.loads[l.Replica]
		cur.PrefillBlocks -= l.PrefillBlocks
		cur.Version++
		m.loads[l.Replica] = cur
	}
	return ok, nil
}

// release takes what is left of a lease off its replica: the prefill too
// unless advance already did.
func (m *Memory) release(_ context.Context, id string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unavailable(); err != nil {
		return false, err
	}
	m.calls = append(m.calls, "release "+id)
	l, ok := m.leases[id]
	if !ok {
		return false, nil
	}
	cur := m.loads[l.Replica]
	if !m.advanced[id] {
		cur.PrefillBlocks -= l.PrefillBlocks
	}
	cur.DecodeBlocks -= l.DecodeBlocks
	cur.Requests--
	cur.Version++
	m.loads[l.Replica] = cur
	delete(m.leases, id)
	delete(m.advanced, id)
	return true, nil
}

func (m *Memory) putReplica(_ context.Context, r kvroute.Replica) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unavailable(); err != nil {
		return err
	}
	m.replicas[r.ID] = r
	return nil
}

func (m *Memory) getReplica(_ context.Context, id string) (kvroute.Replica, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unavailable(); err != nil {
		return kvroute.Replica{}, err
	}
	r, ok := m.replicas[id]
	if !ok {
		return kvroute.Replica{}, fmt.Errorf("mock: replica %q: %w", id, kvroute.ErrNotFound)
	}
	return r, nil
}

func (m *Memory) deleteReplica(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unavailable(); err != nil {
		return err
	}
	if _, ok := m.replicas[id]; !ok {
		return fmt.Errorf("mock: replica %q: %w", id, kvroute.ErrNotFound)
	}
	delete(m.replicas, id)
	return nil
}

// listReplicas returns the registry sorted by id. A fixed order keeps a
// seeded router's tie-breaks the same from run to run, which map order
// would not.
func (m *Memory) listReplicas(context.Context) ([]kvroute.Replica, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unavailable(); err != nil {
		return nil, err
	}
	out := make([]kvroute.Replica, 0, len(m.replicas))
	for _, id := range slices.Sorted(maps.Keys(m.replicas)) {
		out = append(out, m.replicas[id])
	}
	return out, nil
}

// stats counts the distinct blocks a replica holds or was sent.
func (m *Memory) stats(_ context.Context, _, id string) (kvroute.ReplicaStats, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unavailable(); err != nil {
		return kvroute.ReplicaStats{}, err
	}
	n := len(m.held[id])
	for k := range m.approx[id] {
		if !m.held[id][k] {
			n++
		}
	}
	return kvroute.ReplicaStats{Blocks: n}, nil
}

// listLoads returns the load booked on each of ids, in order.
func (m *Memory) listLoads(_ context.Context, _ string, ids []string) ([]kvroute.Load, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if err := m.unavailable(); err != nil {
		return nil, err
	}
	out := make([]kvroute.Load, len(ids))
	for i, id := range ids {
		out[i] = m.loads[id]
	}
	return out, nil
}

// addKeys adds keys to replica's set in sets, making the set on first use.
func addKeys(sets map[string]map[kvroute.BlockKey]bool, replica string, keys []kvroute.BlockKey) {
	if sets[replica] == nil {
		sets[replica] = map[kvroute.BlockKey]bool{}
	}
	for _, k := range keys {
		sets[replica][k] = true
	}
}

// lead is how many of keys, from the first, are in set: a prefix match,
// because a block's KV is only reusable after every block before it.
func lead(set map[kvroute.BlockKey]bool, keys []kvroute.BlockKey) int {
	n := 0
	for n < len(keys) && set[keys[n]] {
		n++
	}
	return n
}
