package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/redis/go-redis/v9"
)

// The registry is one hash, kvr:replicas: replica id -> JSON, plus the
// field "#v", a version bumped in the same MULTI as every change so that
// ingestors notice changes by polling one number. Keeping the version in the
// same key keeps each change a single-key transaction in Redis Cluster.

// PutReplica adds or replaces a replica. A replica that moves to another
// model leaves its old model's index and load state behind, so it is purged.
func (s *Store) PutReplica(ctx context.Context, r kvroute.Replica) error {
	if err := r.Validate(); err != nil {
		return fmt.Errorf("store: put replica: %w", err)
	}
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("store: put replica: %w", err)
	}
	old, err := s.GetReplica(ctx, r.ID)
	if err != nil && !errors.Is(err, kvroute.ErrNotFound) {
		return err
	}
	_, err = s.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, keyReplicas, r.ID, b)
		p.HIncrBy(ctx, keyReplicas, fieldRegVer, 1)
		return nil
	})
	if err != nil {
		return wrap("put replica", err)
	}
	if old.Model != "" && old.Model != r.Model {
		if err := s.purgeServer(ctx, old.Model, old); err != nil {
			return err
		}
	}
	return nil
}

// GetReplica returns the replica registered under id, or an error wrapping
// kvroute.ErrNotFound.
func (s *Store) GetReplica(ctx context.Context, id string) (kvroute.Replica, error) {
	if reservedField(id) {
		return kvroute.Replica{}, fmt.Errorf("store: get replica %q: %w", id, kvroute.ErrNotFound)
	}
	b, err := s.c.HGet(ctx, keyReplicas, id).Bytes()
	if err == redis.Nil {
		return kvroute.Replica{}, fmt.Errorf("store: get replica %q: %w", id, kvroute.ErrNotFound)
	} else if err != nil {
		return kvroute.Replica{}, wrap("get replica", err)
	}
	var r kvroute.Replica
	if err := json.Unmarshal(b, &r); err != nil {
		return kvroute.Replica{}, fmt.Errorf("store: get replica %q: %w", id, err)
	}
	return r, nil
}

// DeleteReplica removes a replica from the registry and purges its index,
// approximate entries, load and leases.
func (s *Store) DeleteReplica(ctx context.Context, id string) error {
	r, err := s.GetReplica(ctx, id)
	if err != nil {
		return err
	}
	_, err = s.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HDel(ctx, keyReplicas, id)
		p.HIncrBy(ctx, keyReplicas, fieldRegVer, 1)
		return nil
	})
	if err != nil {
		return wrap("delete replica", err)
	}
	if err := s.purgeServer(ctx, r.Model, r); err != nil {
		return err
	}
	return nil
}

// purgeServer purges a registered replica's state under model: its own,
// and each data-parallel engine's, which the index, loads and leases know
// by engine ID.
func (s *Store) purgeServer(ctx context.Context, model string, r kvroute.Replica) error {
	if err := s.PurgeReplica(ctx, model, r.ID); err != nil {
		return err
	}
	if r.DataParallelSize <= 1 {
		return nil
	}
	for _, e := range r.Engines() {
		if err := s.PurgeReplica(ctx, model, e.ID); err != nil {
			return err
		}
	}
	return nil
}

// ListReplicas returns every registered replica, sorted by ID.
func (s *Store) ListReplicas(ctx context.Context) ([]kvroute.Replica, error) {
	m, err := s.c.HGetAll(ctx, keyReplicas).Result()
	if err != nil {
		return nil, wrap("list replicas", err)
	}
	out := make([]kvroute.Replica, 0, len(m))
	for id, b := range m {
		if reservedField(id) {
			continue
		}
		var r kvroute.Replica
		if err := json.Unmarshal([]byte(b), &r); err != nil {
			return nil, fmt.Errorf("store: list replicas: %q: %w", id, err)
		}
		out = append(out, r)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// RegistryVersion returns a number that changes on every registry change.
func (s *Store) RegistryVersion(ctx context.Context) (int64, error) {
	v, err := s.c.HGet(ctx, keyReplicas, fieldRegVer).Result()
	if err == redis.Nil {
		return 0, nil
	} else if err != nil {
		return 0, wrap("registry version", err)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("store: registry version: %w", err)
	}
	return n, nil
}

// SetHealth records a probe's outcome on the registered replica. The
// registry version moves only when the health changes, so that routine
// probes do not make every ingestor reload.
func (s *Store) SetHealth(ctx context.Context, id string, h kvroute.Health, at time.Time) error {
	return s.updateReplica(ctx, "set health", id, func(r *kvroute.Replica) bool {
		changed := r.Health != h
		r.Health, r.Checked = h, at
		return changed
	})
}

// SetFollowed records when an ingestor finished catching up on the
// replica's events (zero: nobody follows it now). It moves the registry
// version, so that pods learn at their next registry read that the
// replica's index is complete.
func (s *Store) SetFollowed(ctx context.Context, id string, since time.Time) error {
	return s.updateReplica(ctx, "set followed", id, func(r *kvroute.Replica) bool {
		changed := r.FollowedSince.IsZero() != since.IsZero()
		r.FollowedSince = since
		return changed
	})
}

// SetBlockSize records the block size the replica reports (vLLM's
// cache_config_info), which the router keys the model's requests with. It
// writes, and moves the registry version, only when the size changes.
func (s *Store) SetBlockSize(ctx context.Context, id string, size int) error {
	if size <= 0 || size > kvroute.MaxBlockSize {
		return fmt.Errorf("store: set block size %q: %d: %w", id, size, kvroute.ErrInvalidInput)
	}
	return s.updateReplica(ctx, "set block size", id, func(r *kvroute.Replica) bool {
		changed := r.BlockSize != size
		r.BlockSize = size
		return changed
	})
}

// updateReplica rewrites one registered replica under optimistic locking:
// edit changes it and reports whether the change must move the registry
// version (ingestors reload on a move). An edit that neither changes the
// replica nor records a probe time is not written back.
func (s *Store) updateReplica(ctx context.Context, op, id string, edit func(*kvroute.Replica) bool) error {
	for range 16 {
		err := s.c.Watch(ctx, func(tx *redis.Tx) error {
			b, err := tx.HGet(ctx, keyReplicas, id).Bytes()
			if err == redis.Nil || reservedField(id) {
				return fmt.Errorf("replica %q: %w", id, kvroute.ErrNotFound)
			} else if err != nil {
				return err
			}
			var r kvroute.Replica
			if err := json.Unmarshal(b, &r); err != nil {
				return err
			}
			before := r
			changed := edit(&r)
			if !changed && r.Checked.Equal(before.Checked) {
				return nil
			}
			nb, err := json.Marshal(r)
			if err != nil {
				return err
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.HSet(ctx, keyReplicas, id, nb)
				if changed {
					p.HIncrBy(ctx, keyReplicas, fieldRegVer, 1)
				}
				return nil
			})
			return err
		}, keyReplicas)
		if err == redis.TxFailedErr {
			continue
		}
		return wrap(op, err)
	}
	return fmt.Errorf("store: %s %q: too much contention", op, id)
}

// Acquire takes or renews the ownership lease name for owner (an ingestor
// sharing out replicas): true if owner holds it for ttl from now.
func (s *Store) Acquire(ctx context.Context, name, owner string, ttl time.Duration) (bool, error) {
	if ttl < time.Millisecond {
		return false, fmt.Errorf("store: acquire: ttl %v: %w", ttl, kvroute.ErrInvalidInput)
	}
	n, err := scriptAcquire.Run(ctx, s.c, []string{ownKey(name)}, owner, ttl.Milliseconds()).Int()
	if err != nil {
		return false, wrap("acquire", err)
	}
	return n == 1, nil
}

// ReleaseOwnership gives up owner's lease on name; someone else's lease is
// left alone.
func (s *Store) ReleaseOwnership(ctx context.Context, name, owner string) error {
	return wrap("release ownership", scriptDisown.Run(ctx, s.c, []string{ownKey(name)}, owner).Err())
}

// EditReplica rewrites the replica id as edit makes it, atomically (under
// optimistic locking), for a writer that must decide from what is stored
// now: discovery, which may only touch the replicas its own source wrote.
// edit gets the stored replica (the zero Replica and found false when
// there is none) and says whether to write it; an error from edit is
// returned as it is and nothing is written. The written replica is
// validated, the registry version moves only when it changed, and a
// replica that moved to another model has its old model's state purged,
// as PutReplica does.
func (s *Store) EditReplica(ctx context.Context, id string, edit func(r *kvroute.Replica, found bool) (bool, error)) error {
	if reservedField(id) || id == "" {
		return fmt.Errorf("store: edit replica %q: %w", id, kvroute.ErrInvalidInput)
	}
	for range 16 {
		var oldModel string
		var old kvroute.Replica
		err := s.c.Watch(ctx, func(tx *redis.Tx) error {
			var r kvroute.Replica
			b, err := tx.HGet(ctx, keyReplicas, id).Bytes()
			found := err == nil
			if err != nil && err != redis.Nil {
				return wrap("edit replica", err)
			}
			if found {
				if err := json.Unmarshal(b, &r); err != nil {
					return fmt.Errorf("store: edit replica %q: %w", id, err)
				}
			}
			oldModel, old = r.Model, r
			write, err := edit(&r, found)
			if err != nil || !write {
				oldModel = ""
				return err
			}
			r.ID = id
			if err := r.Validate(); err != nil {
				return fmt.Errorf("store: edit replica: %w", err)
			}
			nb, err := json.Marshal(r)
			if err != nil {
				return fmt.Errorf("store: edit replica: %w", err)
			}
			if found && string(nb) == string(b) {
				oldModel = ""
				return nil
			}
			if oldModel == r.Model {
				oldModel = ""
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.HSet(ctx, keyReplicas, id, nb)
				p.HIncrBy(ctx, keyReplicas, fieldRegVer, 1)
				return nil
			})
			return err
		}, keyReplicas)
		if err == redis.TxFailedErr {
			continue
		}
		if err != nil {
			return err
		}
		if oldModel != "" {
			old.ID = id
			return s.purgeServer(ctx, oldModel, old)
		}
		return nil
	}
	return fmt.Errorf("store: edit replica %q: too much contention", id)
}

// DeleteReplicaIf removes the replica id, as DeleteReplica does (its
// index, approximate entries, load and leases purged), only if keep
// reports false for the replica stored now, checked atomically: discovery
// purges a replica that is still its own and still gone, never one an
// operator or another source wrote meanwhile. It reports whether it
// deleted; a replica that is not there is not an error.
func (s *Store) DeleteReplicaIf(ctx context.Context, id string, del func(kvroute.Replica) bool) (bool, error) {
	if reservedField(id) || id == "" {
		return false, fmt.Errorf("store: delete replica %q: %w", id, kvroute.ErrInvalidInput)
	}
	for range 16 {
		var gone kvroute.Replica
		deleted := false
		err := s.c.Watch(ctx, func(tx *redis.Tx) error {
			b, err := tx.HGet(ctx, keyReplicas, id).Bytes()
			if err == redis.Nil {
				return nil
			} else if err != nil {
				return wrap("delete replica", err)
			}
			var r kvroute.Replica
			if err := json.Unmarshal(b, &r); err != nil {
				return fmt.Errorf("store: delete replica %q: %w", id, err)
			}
			if !del(r) {
				return nil
			}
			_, err = tx.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.HDel(ctx, keyReplicas, id)
				p.HIncrBy(ctx, keyReplicas, fieldRegVer, 1)
				return nil
			})
			gone, deleted = r, err == nil
			return err
		}, keyReplicas)
		if err == redis.TxFailedErr {
			continue
		}
		if err != nil {
			return false, err
		}
		if deleted {
			gone.ID = id
			return true, s.purgeServer(ctx, gone.Model, gone)
		}
		return false, nil
	}
	return false, fmt.Errorf("store: delete replica %q: too much contention", id)
}

// SetDataParallelSize records how many data-parallel engines the replica
// runs, as its metrics' engine labels say (an ingestor learns it when no
// operator declared it). It writes, and moves the registry version, only
// when the size changes.
func (s *Store) SetDataParallelSize(ctx context.Context, id string, n int) error {
	if n < 0 || n > kvroute.MaxDataParallelSize {
		return fmt.Errorf("store: set data parallel size %q: %d: %w", id, n, kvroute.ErrInvalidInput)
	}
	return s.updateReplica(ctx, "set data parallel size", id, func(r *kvroute.Replica) bool {
		changed := r.DataParallelSize != n
		r.DataParallelSize = n
		return changed
	})
}

// SetPinIgnored records that the replica's engines ignore the rank
// header, so that every pod routes it as one replica from its next
// registry read. It is written once; a later call changes nothing.
func (s *Store) SetPinIgnored(ctx context.Context, id string) error {
	return s.updateReplica(ctx, "set pin ignored", id, func(r *kvroute.Replica) bool {
		changed := !r.PinIgnored
		r.PinIgnored = true
		return changed
	})
}
