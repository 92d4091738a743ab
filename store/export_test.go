package store

import "github.com/kvroute/kvroute"

// SetLookupHints files pos as the run ends Lookup should probe first for
// chains through keys, whatever the index says: tests check that wrong
// hints never change an answer.
func (s *Store) SetLookupHints(model string, keys []kvroute.BlockKey, pos []int32) {
	s.hints.mu.Lock()
	defer s.hints.mu.Unlock()
	for p := hintStride; p < len(keys); p += hintStride {
		s.hints.set(hintKey{model, keys[p]}, pos)
	}
}

// PlainLookups returns how many hinted lookups tried plain reads, and how
// many of those proved the whole chain.
func (s *Store) PlainLookups() (tries, hits int64) {
	return s.fast.allTries.Load(), s.fast.allHits.Load()
}
