package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"
)

// keyEpoch holds the store's epoch. It is a global key, read about once a
// second by each scoring pod: one GET, never part of a script.
const keyEpoch = "kvr:epoch"

// Epoch returns the store's epoch, a random id written by the first
// kvroute process that meets the store. A Redis that lost its data (a
// restart without persistence, a failover to an empty replica, FLUSHALL)
// has none, and the next process to ask writes a new one: every process
// that knew the old one learns that the registry, the index and the loads
// are gone, rather than taking an empty registry for the truth.
func (s *Store) Epoch(ctx context.Context) (string, error) {
	var b [16]byte
	_, _ = rand.Read(b[:])
	if err := s.c.SetNX(ctx, keyEpoch, hex.EncodeToString(b[:]), 0).Err(); err != nil {
		return "", wrap("epoch", err)
	}
	v, err := s.c.Get(ctx, keyEpoch).Result()
	if err != nil {
		return "", wrap("epoch", err)
	}
	return v, nil
}
