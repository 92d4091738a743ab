package scoring

import (
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/cespare/xxhash/v2"
)

// A ring is the consistent-hash ring of one set of replicas: VirtualNodes
// points per replica, so that sessions spread evenly and a replica joining
// or leaving moves only its own share of them.
type ring struct {
	points []uint64
	owner  []string
}

func newRing(ids []string, vnodes int) *ring {
	type pt struct {
		h  uint64
		id string
	}
	pts := make([]pt, 0, len(ids)*vnodes)
	for _, id := range ids {
		for v := 0; v < vnodes; v++ {
			pts = append(pts, pt{xxhash.Sum64String(id + "#" + strconv.Itoa(v)), id})
		}
	}
	slices.SortFunc(pts, func(a, b pt) int {
		if a.h != b.h {
			if a.h < b.h {
				return -1
			}
			return 1
		}
		return strings.Compare(a.id, b.id)
	})
	r := &ring{points: make([]uint64, len(pts)), owner: make([]string, len(pts))}
	for i, p := range pts {
		r.points[i], r.owner[i] = p.h, p.id
	}
	return r
}

func (r *ring) lookup(key string) string {
	h := xxhash.Sum64String(key)
	i, _ := slices.BinarySearch(r.points, h)
	if i == len(r.points) {
		i = 0
	}
	return r.owner[i]
}

// rings memoizes rings by replica set. Building one costs replicas ×
// VirtualNodes hashes and a sort; the set changes rarely, decisions often.
// Memoizing a pure function keeps Pick pure.
var rings = struct {
	sync.Mutex
	m map[string]*ring
}{m: map[string]*ring{}}

const maxRings = 64

func ringPick(vnodes int, session string, eligible []int, cands []Candidate) int {
	ids := make([]string, len(eligible))
	for j, i := range eligible {
		ids[j] = cands[i].ID
	}
	slices.Sort(ids)
	key := strconv.Itoa(vnodes) + "\x00" + strings.Join(ids, "\x00")
	rings.Lock()
	r := rings.m[key]
	if r == nil {
		if len(rings.m) >= maxRings {
			clear(rings.m)
		}
		r = newRing(ids, vnodes)
		rings.m[key] = r
	}
	rings.Unlock()
	owner := r.lookup(session)
	for _, i := range eligible {
		if cands[i].ID == owner {
			return i
		}
	}
	return eligible[0] // unreachable: the ring holds only eligible IDs
}
