package store_test

import (
	"context"
	"encoding/binary"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/store"
	"github.com/redis/go-redis/v9"
)

// backends lists the servers every store test runs against: miniredis for
// speed, a real redis-server because that is what production runs (its Lua,
// its encodings, its error replies).
var backends = []struct {
	name string
	url  func(testing.TB) string
}{
	{"miniredis", redistest.Miniredis},
	{"redis", redistest.Server},
}

// env is one test's store, raw client and clock.
type env struct {
	s   *store.Store
	rc  *redis.Client
	clk *clock
	url string
}

func forBackends(t *testing.T, fn func(t *testing.T, e *env)) {
	t.Helper()
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			fn(t, newEnv(t, b.url(t)))
		})
	}
}

func newEnv(tb testing.TB, url string) *env {
	tb.Helper()
	clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	s, err := store.Open(context.Background(), url, store.Options{Now: clk.Now})
	if err != nil {
		tb.Fatalf("open: %v", err)
	}
	tb.Cleanup(func() { s.Close() })
	o, err := redis.ParseURL(url)
	if err != nil {
		tb.Fatal(err)
	}
	rc := redis.NewClient(o)
	tb.Cleanup(func() { rc.Close() })
	return &env{s: s, rc: rc, clk: clk, url: url}
}

type clock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Add(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// ehOf is the engine hash the tests' fake engines give a block.
func ehOf(k kvroute.BlockKey) uint64 { return uint64(k)*0x9e3779b97f4a7c15 + 7 }

func store1(k, parent kvroute.BlockKey, tier kvroute.Tier) kvroute.IndexOp {
	return kvroute.IndexOp{Kind: kvroute.OpStore, EngineHash: ehOf(k), Key: k, Parent: parent, Tier: tier}
}

func remove1(k kvroute.BlockKey, tier kvroute.Tier) kvroute.IndexOp {
	return kvroute.IndexOp{Kind: kvroute.OpRemove, EngineHash: ehOf(k), Tier: tier}
}

// storeChain stores keys[from:to] with their chain parents.
func storeChain(keys []kvroute.BlockKey, from, to int, tier kvroute.Tier) []kvroute.IndexOp {
	var ops []kvroute.IndexOp
	for i := from; i < to; i++ {
		p := kvroute.NoParent
		if i > 0 {
			p = keys[i-1]
		}
		ops = append(ops, store1(keys[i], p, tier))
	}
	return ops
}

// chain returns n fresh random keys.
func chain(rng *rand.Rand, n int) []kvroute.BlockKey {
	out := make([]kvroute.BlockKey, n)
	for i := range out {
		for out[i] == kvroute.NoParent {
			out[i] = kvroute.BlockKey(rng.Uint64())
		}
	}
	return out
}

// model is the reference index: the seed's plain per-replica scan that the
// Redis index must agree with on every request.
type model struct {
	refs   map[string]map[kvroute.BlockKey]*[2]int
	e2r    map[string]map[uint64]kvroute.BlockKey
	approx map[string]map[kvroute.BlockKey]time.Time
}

func newModel() *model {
	return &model{refs: map[string]map[kvroute.BlockKey]*[2]int{}, e2r: map[string]map[uint64]kvroute.BlockKey{},
		approx: map[string]map[kvroute.BlockKey]time.Time{}}
}

func (m *model) apply(r string, ops []kvroute.IndexOp) kvroute.ApplyResult {
	// A replica the model never saw had no applied seq: its first run.
	res := kvroute.ApplyResult{Applied: true, NoPrior: m.refs[r] == nil}
	if m.refs[r] == nil {
		m.refs[r] = map[kvroute.BlockKey]*[2]int{}
		m.e2r[r] = map[uint64]kvroute.BlockKey{}
	}
	refs, e2r := m.refs[r], m.e2r[r]
	for _, op := range ops {
		switch op.Kind {
		case kvroute.OpStore:
			if refs[op.Key] == nil {
				refs[op.Key] = new([2]int)
			}
			refs[op.Key][op.Tier]++
			e2r[op.EngineHash] = op.Key
			res.Stored++
		case kvroute.OpRemove:
			k, ok := e2r[op.EngineHash]
			c := refs[k]
			switch {
			case !ok:
				res.Unknown++
			case c == nil:
				res.Unknown++
				delete(e2r, op.EngineHash)
			case c[op.Tier] == 0:
				res.Unknown++
			default:
				c[op.Tier]--
				res.Removed++
				if c[0]+c[1] == 0 {
					delete(refs, k)
					delete(e2r, op.EngineHash)
				}
			}
		case kvroute.OpClear:
			clear(refs)
			clear(e2r)
		}
	}
	return res
}

func (m *model) recordApprox(r string, keys []kvroute.BlockKey, exp time.Time) {
	if m.approx[r] == nil {
		m.approx[r] = map[kvroute.BlockKey]time.Time{}
	}
	for _, k := range keys {
		if exp.After(m.approx[r][k]) {
			m.approx[r][k] = exp
		}
	}
}

// overlap is the brute-force scan: count leading keys held, stop at the
// first hole.
func (m *model) overlap(r string, keys []kvroute.BlockKey, now time.Time) kvroute.Overlap {
	var o kvroute.Overlap
	for o.GPU < len(keys) {
		c := m.refs[r][keys[o.GPU]]
		if c == nil || c[0] == 0 {
			break
		}
		o.GPU++
	}
	for o.Any < len(keys) {
		if m.refs[r][keys[o.Any]] == nil {
			break
		}
		o.Any++
	}
	for o.Approx < len(keys) {
		if !m.approx[r][keys[o.Approx]].After(now) {
			break
		}
		o.Approx++
	}
	return o
}

func replicaNames(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = "r" + strconv.Itoa(i)
	}
	return out
}

// checkRefs compares every (replica, block) refcount in Redis with m: the
// counts in each replica's engine-hash map, and the replica's HG/HA bits in
// the block's entry.
func checkRefs(t *testing.T, e *env, modelName string, m *model, keys []kvroute.BlockKey) {
	t.Helper()
	ctx := context.Background()
	p := "kvr:{m:" + modelName + "}:"
	for r, refs := range m.refs {
		e2r, err := e.rc.HGetAll(ctx, p+"r:"+r+":e2r").Result()
		if err != nil {
			t.Fatal(err)
		}
		held := map[kvroute.BlockKey]string{}
		for _, v := range e2r {
			// Records: engine-hash suffix (2), key (8), "gpu,host", ';'.
			// The refs text holds no ';' (the binary bytes may).
			for len(v) > 0 {
				end := 10 + strings.IndexByte(v[10:], ';')
				held[kvroute.BlockKey(binary.BigEndian.Uint64([]byte(v[2:10])))] = v[10:end]
				v = v[end+1:]
			}
		}
		slot := -1
		if s, err := e.rc.HGet(ctx, p+"load", r+"#i").Result(); err == nil {
			slot, _ = strconv.Atoi(s)
		}
		for _, k := range keys {
			want := ""
			if c := refs[k]; c != nil {
				want = strconv.Itoa(c[0]) + "," + strconv.Itoa(c[1])
			}
			if g := held[k]; g != want {
				t.Errorf("block %v replica %s: refs %q, want %q", k, r, g, want)
			}
			var kb [8]byte
			binary.BigEndian.PutUint64(kb[:], uint64(k))
			v, err := e.rc.HGet(ctx, p+"blk", string(kb[:])).Result()
			if err == redis.Nil {
				v = ""
			} else if err != nil {
				t.Fatal(err)
			}
			hg, ha := entryBit(v, 2, slot), entryBit(v, 3, slot)
			if c := refs[k]; hg != (c != nil && c[0] > 0) || ha != (c != nil) {
				t.Errorf("block %v replica %s: bits hg=%v ha=%v, refs %v", k, r, hg, ha, c)
			}
		}
	}
}

// entryBit reads bitmap i (0 RG, 1 RA, 2 HG, 3 HA) of a block entry at slot.
func entryBit(v string, i, slot int) bool {
	if len(v) < 17 || slot < 0 {
		return false
	}
	if v[16] >= 2 { // shape bit: one bitmap stands for all four
		i = 0
	}
	v = v[17:]
	for ; i > 0; i-- {
		v = v[1+int(v[0]):]
	}
	bm := v[1 : 1+int(v[0])]
	return slot/8 < len(bm) && bm[slot/8]&(1<<(slot%8)) != 0
}

// rid is the test model's request id with unique part s.
func rid(s string) string { return store.RequestID(mdl, s) }
