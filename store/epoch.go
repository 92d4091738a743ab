package store

import (
	"context"
	"crypto/rand"
	"encoding/hex"

	"github.com/redis/go-redis/v9"
)

// Epoch returns the store's epoch, a random id written by the first
// kvroute process that meets the store. A Redis that lost its data (a
// restart without persistence, a failover to an empty replica, FLUSHALL)
// has none, and the next process to ask writes a new one: every process
// that knew the old one learns that the registry, the index and the loads
// are gone, rather than taking an empty registry for the truth.
//
// It is a field of the registry's own hash (kvr:replicas), read about once
// a second by each scoring pod and each ingestor, so that under Redis
// Cluster the epoch is lost exactly when the registry is: a shard that
// came back empty with the registry on it is re-seeded by the pods. (A
// key of its own, on another shard, once let the registry's shard lose
// the registry unnoticed, and the fleet's replicas were gone for good.)
// A model's keys live on their own shard, with their own epoch
// (ModelEpoch).
func (s *Store) Epoch(ctx context.Context) (string, error) {
	return s.epochAt(ctx, "epoch", keyReplicas, fieldEpoch)
}

// ModelEpoch is Epoch for one model's slot: a random id kept in the
// model's own keys. Under Redis Cluster a shard can lose its data alone
// (it restarted empty before its replica was promoted) while the shard of
// the global epoch keeps its own: the model's index is gone and nothing
// else says so. An ingestor that follows the model's replicas compares
// this one too and rebuilds them at once, rather than at their next
// batch, which a quiet replica may not send for minutes. On one Redis it
// changes with the global epoch.
func (s *Store) ModelEpoch(ctx context.Context, model string) (string, error) {
	return s.epochAt(ctx, "model epoch", prefix(model)+"epoch", "")
}

// epochAt reads the epoch kept at key (in field, when key is a hash) and,
// only when there is none, writes a new random one where none is yet
// (another process may write first: its epoch is the one read back). Every
// pod and ingestor asks about once a second: the common case is one read.
func (s *Store) epochAt(ctx context.Context, op, key, field string) (string, error) {
	get := func() (string, error) {
		if field == "" {
			return s.c.Get(ctx, key).Result()
		}
		return s.c.HGet(ctx, key, field).Result()
	}
	v, err := get()
	if err == nil {
		return v, nil
	} else if err != redis.Nil {
		return "", wrap(op, err)
	}
	var b [16]byte
	_, _ = rand.Read(b[:])
	if field == "" {
		err = s.c.SetNX(ctx, key, hex.EncodeToString(b[:]), 0).Err()
	} else {
		err = s.c.HSetNX(ctx, key, field, hex.EncodeToString(b[:])).Err()
	}
	if err != nil {
		return "", wrap(op, err)
	}
	if v, err = get(); err != nil {
		return "", wrap(op, err)
	}
	return v, nil
}
