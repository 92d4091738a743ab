package ingestor_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/ingestor/internal/wire"
	"github.com/kvroute/kvroute/ingestor/kvevents"
)

// fakeStore is an in-memory ingestor.Store with the real store's semantics
// where the ingestor depends on them: ApplyRun is a no-op for a run whose
// first seq is not newer than the applied one, ResetReplica forgets entries
// and seq, both refuse a writer other than the replica's claimed one
// (ErrFenced), and ApplyRun refuses a run that does not follow the
// applied seq (ErrStoreBehind).
type fakeStore struct {
	mu       sync.Mutex
	seq      map[string]int64
	e2r      map[string]map[uint64]kvroute.BlockKey
	held     map[string]map[kvroute.BlockKey]int
	applied  map[string][]int64 // seqs applied, in order
	calls    map[string]int     // ApplyRun calls
	resets   map[string]int
	failNext int // ApplyRun errors left to return
	// failAfter is how many ApplyRun calls apply and then return an error,
	// as a reply lost after the script ran; failReset how many
	// ResetReplica calls fail.
	failAfter, failReset int
	from                 map[string]int64  // first seq of the history stored
	writer               map[string]string // each replica's claimed writer

	replicas  []kvroute.Replica
	version   int64
	epoch     string
	leases    map[string]string
	health    map[string]kvroute.Health
	followed  map[string]time.Time
	scraped   map[string][3]float64
	blockSize map[string]int
	purged    map[string]int
	swept     int
}

func newFakeStore() *fakeStore {
	return &fakeStore{
		seq: map[string]int64{}, e2r: map[string]map[uint64]kvroute.BlockKey{},
		held: map[string]map[kvroute.BlockKey]int{}, applied: map[string][]int64{}, calls: map[string]int{}, resets: map[string]int{},
		leases: map[string]string{}, health: map[string]kvroute.Health{}, scraped: map[string][3]float64{}, blockSize: map[string]int{},
		purged: map[string]int{}, from: map[string]int64{}, writer: map[string]string{},
	}
}

// fenced applies lua/fence.lua's rule to replica id: writer is refused
// when another holds it, and claims it when nobody does. The caller holds
// s.mu.
func (s *fakeStore) fenced(id, writer string) bool {
	switch holder := s.writer[id]; {
	case writer == "":
		return false
	case holder != "" && holder != writer:
		return true
	default:
		s.writer[id] = writer
		return false
	}
}

// callCount is how many ApplyRun calls the replica had.
func (s *fakeStore) callCount(model, replica string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.calls[model+"/"+replica]
}

func (s *fakeStore) ClaimReplica(_ context.Context, model, replica, writer string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.writer[model+"/"+replica] = writer
	return nil
}

var _ ingestor.Store = (*fakeStore)(nil)

func (s *fakeStore) ApplyRun(_ context.Context, model, replica, writer string, first, last int64, ops []kvroute.IndexOp) (kvroute.ApplyResult, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := model + "/" + replica
	s.calls[id]++
	if s.failNext > 0 {
		s.failNext--
		return kvroute.ApplyResult{}, errors.New("fake: unavailable")
	}
	if s.fenced(id, writer) {
		return kvroute.ApplyResult{}, kvroute.ErrFenced
	}
	applied, had := s.seq[id]
	if had && applied >= first {
		return kvroute.ApplyResult{}, nil
	}
	if had && applied < first-1 {
		return kvroute.ApplyResult{}, kvroute.ErrStoreBehind
	}
	if s.e2r[id] == nil {
		s.e2r[id], s.held[id] = map[uint64]kvroute.BlockKey{}, map[kvroute.BlockKey]int{}
	}
	var res kvroute.ApplyResult
	for _, op := range ops {
		switch op.Kind {
		case kvroute.OpStore:
			s.e2r[id][op.EngineHash] = op.Key
			s.held[id][op.Key]++
			res.Stored++
		case kvroute.OpRemove:
			k, ok := s.e2r[id][op.EngineHash]
			if !ok || s.held[id][k] == 0 {
				res.Unknown++
				continue
			}
			if s.held[id][k]--; s.held[id][k] == 0 {
				delete(s.held[id], k)
				delete(s.e2r[id], op.EngineHash)
			}
			res.Removed++
		case kvroute.OpClear:
			s.e2r[id], s.held[id] = map[uint64]kvroute.BlockKey{}, map[kvroute.BlockKey]int{}
		}
	}
	s.seq[id] = last
	for seq := first; seq <= last; seq++ {
		s.applied[id] = append(s.applied[id], seq)
	}
	res.Applied, res.NoPrior = true, !had
	if !had {
		s.from[id] = first
	}
	if s.failAfter > 0 {
		s.failAfter--
		return kvroute.ApplyResult{}, errors.New("fake: reply lost")
	}
	return res, nil
}

func (s *fakeStore) HistoryStart(_ context.Context, model, replica string) (int64, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.from[model+"/"+replica]
	return v, ok, nil
}

// lose forgets a replica's entries and seq as a store that lost its data
// would (a Cluster shard back empty): no reset is counted.
func (s *fakeStore) lose(model, replica string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := model + "/" + replica
	delete(s.seq, id)
	delete(s.e2r, id)
	delete(s.held, id)
	delete(s.from, id)
}

func (s *fakeStore) AppliedSeq(_ context.Context, model, replica string) (int64, bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.seq[model+"/"+replica]
	return v, ok, nil
}

func (s *fakeStore) ResetReplica(_ context.Context, model, replica, writer string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failReset > 0 {
		s.failReset--
		return errors.New("fake: reset unavailable")
	}
	id := model + "/" + replica
	if s.fenced(id, writer) {
		return kvroute.ErrFenced
	}
	delete(s.from, id)
	delete(s.seq, id)
	delete(s.e2r, id)
	delete(s.held, id)
	s.resets[id]++
	return nil
}

func (s *fakeStore) EngineKeys(_ context.Context, model, replica string, hs []uint64) ([]kvroute.BlockKey, []bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys, found := make([]kvroute.BlockKey, len(hs)), make([]bool, len(hs))
	for i, h := range hs {
		keys[i], found[i] = s.e2r[model+"/"+replica][h]
	}
	return keys, found, nil
}

func (s *fakeStore) ListReplicas(context.Context) ([]kvroute.Replica, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]kvroute.Replica(nil), s.replicas...), nil
}

func (s *fakeStore) RegistryVersion(context.Context) (int64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.version, nil
}

// ModelEpoch changes with the store's epoch, as on one Redis.
func (s *fakeStore) ModelEpoch(ctx context.Context, model string) (string, error) {
	ep, err := s.Epoch(ctx)
	return model + "/" + ep, err
}

func (s *fakeStore) Epoch(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.epoch == "" {
		s.epoch = "e0"
	}
	return s.epoch, nil
}

func (s *fakeStore) setReplicas(rs ...kvroute.Replica) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.replicas = rs
	s.version++
}

func (s *fakeStore) Acquire(_ context.Context, name, owner string, _ time.Duration) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if o, ok := s.leases[name]; ok && o != owner {
		return false, nil
	}
	s.leases[name] = owner
	return true, nil
}

func (s *fakeStore) ReleaseOwnership(_ context.Context, name, owner string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.leases[name] == owner {
		delete(s.leases, name)
	}
	return nil
}

func (s *fakeStore) SetHealth(_ context.Context, id string, h kvroute.Health, _ time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.health[id] = h
	return nil
}

func (s *fakeStore) SetBlockSize(_ context.Context, id string, size int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.blockSize[id] = size
	return nil
}

func (s *fakeStore) SetDataParallelSize(_ context.Context, id string, n int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for i, r := range s.replicas {
		if r.ID == id && r.DataParallelSize != n {
			s.replicas[i].DataParallelSize = n
			s.version++
		}
	}
	return nil
}

func (s *fakeStore) SetFollowed(_ context.Context, id string, since time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.followed == nil {
		s.followed = map[string]time.Time{}
	}
	s.followed[id] = since
	return nil
}

func (s *fakeStore) SetScraped(_ context.Context, model, replica string, waiting, running int64, kv float64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.scraped[replica] = [3]float64{float64(waiting), float64(running), kv}
	return nil
}

func (s *fakeStore) SweepExpired(context.Context, string) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.swept++
	return 0, nil
}

func (s *fakeStore) PurgeReplica(ctx context.Context, model, replica string) error {
	s.mu.Lock()
	s.purged[replica]++
	delete(s.writer, model+"/"+replica)
	s.mu.Unlock()
	return s.ResetReplica(ctx, model, replica, "")
}

// appliedSeqs returns the seqs applied for replica since the last call.
func (s *fakeStore) appliedSeqs(model, replica string) []int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	id := model + "/" + replica
	out := s.applied[id]
	s.applied[id] = nil
	return out
}

func (s *fakeStore) heldKeys(model, replica string) []kvroute.BlockKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []kvroute.BlockKey
	for k := range s.held[model+"/"+replica] {
		out = append(out, k)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// fakePub plays a replica's publisher: it numbers batches, keeps a bounded
// replay buffer, and can restart (seq back to 0, buffer emptied).
type fakePub struct {
	tb      testing.TB
	topic   string
	seq     uint64
	epoch   int
	buf     [][][]byte
	bufSize int
	// oldLayout answers replays without the topic frame (before #45177).
	oldLayout bool
}

// next publishes one batch of events and returns its live frames.
func (p *fakePub) next(events ...any) [][]byte {
	p.tb.Helper()
	if events == nil {
		events = []any{}
	}
	// ts differs per epoch, so a restarted publisher's batch at a seq
	// never has the bytes of the old one.
	f := wire.Msg(p.tb, p.topic, p.seq, []any{float64(p.epoch*1000) + float64(p.seq), events, 0})
	p.seq++
	p.buf = append(p.buf, f)
	if p.bufSize > 0 && len(p.buf) > p.bufSize {
		p.buf = p.buf[1:]
	}
	return f
}

func (p *fakePub) restart() {
	p.seq, p.buf = 0, nil
	p.epoch++
}

// replay answers like the ROUTER socket, in either frame layout, through
// the package's own reply decoder.
func (p *fakePub) replay(calls *int) ingestor.ReplayFunc {
	return func(_ context.Context, from uint64, fn func(kvevents.Batch) error) error {
		*calls++
		var replies [][][]byte
		for _, f := range p.buf {
			if seqOf(f) >= from {
				if p.oldLayout {
					replies = append(replies, [][]byte{{}, f[1], f[2]})
				} else {
					replies = append(replies, [][]byte{{}, f[0], f[1], f[2]})
				}
			}
		}
		if p.oldLayout {
			replies = append(replies, [][]byte{{}, wire.Seq8(kvevents.EndSeq), {}})
		} else {
			replies = append(replies, [][]byte{{}, {}, wire.Seq8(kvevents.EndSeq), {}})
		}
		for _, r := range replies {
			m, err := kvevents.DecodeReplay(r)
			if err != nil {
				return fmt.Errorf("fake replay: %w", err)
			}
			if m.End {
				return nil
			}
			if err := fn(m.Batch); err != nil {
				return err
			}
		}
		return errors.New("fake replay: no end marker")
	}
}

func seqOf(f [][]byte) uint64 {
	var u uint64
	for _, c := range f[1] {
		u = u<<8 | uint64(c)
	}
	return u
}
