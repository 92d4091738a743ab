package router

import (
	"sync"
	"time"

	"github.com/kvroute/kvroute"
)

// suspectSet holds the replicas this process saw fail (a proxied request
// refused or reset before any response byte), each until a deadline.
// Decisions skip a suspect while another replica of its model is
// routable, so that the requests after a replica dies do not wait for
// the ingestor's next health probe to learn it. It is in-process and
// time-bounded on purpose: one pod's failed connection is a hint, not a
// fact to publish fleet-wide (the health probe is that), and it must
// lapse by itself when the replica comes back. The zero value is empty.
type suspectSet struct {
	mu    sync.Mutex
	until map[string]time.Time
}

// MarkSuspect has this router's decisions skip replica id for ttl while
// other replicas of its model are routable. Marking it again extends the
// deadline.
func (r *Router) MarkSuspect(id string, ttl time.Duration) {
	s := &r.suspects
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.until == nil {
		s.until = map[string]time.Time{}
	}
	s.until[id] = r.now().Add(ttl)
}

// Suspect reports whether replica id is suspect now.
func (r *Router) Suspect(id string) bool {
	s := &r.suspects
	s.mu.Lock()
	defer s.mu.Unlock()
	return r.now().Before(s.until[id])
}

// demote returns fleet with its suspects made unroutable (so that scoring
// and degraded mode skip them, and explain shows them as not eligible),
// unless no other replica of fleet is routable: a suspect is still better
// than no answer. Expired entries are dropped. fleet itself is not
// modified.
func (s *suspectSet) demote(now time.Time, fleet []kvroute.Replica) []kvroute.Replica {
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.until) == 0 {
		return fleet
	}
	for id, t := range s.until {
		if !now.Before(t) {
			delete(s.until, id)
		}
	}
	suspects, others := 0, 0
	for _, rep := range fleet {
		if !rep.Routable() {
			continue
		}
		if _, ok := s.until[rep.ID]; ok {
			suspects++
		} else {
			others++
		}
	}
	if suspects == 0 || others == 0 {
		return fleet
	}
	out := make([]kvroute.Replica, len(fleet))
	for i, rep := range fleet {
		if _, ok := s.until[rep.ID]; ok {
			rep.Health = kvroute.HealthUnhealthy
		}
		out[i] = rep
	}
	return out
}
