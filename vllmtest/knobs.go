package vllmtest

import (
	"fmt"
	"time"
)

// DropNext makes the next n batches take a sequence number without being
// published, as when a PUB socket drops past its high-water mark: a
// subscriber sees a gap, and the batches stay in the replay buffer so the
// gap can be closed.
func (r *Replica) DropNext(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dropNext += n
}

// Stall holds every batch back for d; they are published, in order, when
// the stall ends. Replay keeps answering meanwhile.
func (r *Replica) Stall(d time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.stallUntil = time.Now().Add(d)
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// Restart behaves like a restarted vLLM process: the cache is empty, the
// sequence starts again at 0 and the replay buffer is empty, and nothing
// announces it: no AllBlocksCleared is sent. Sockets stay bound, so
// subscribers detect the restart only by the sequence going backwards.
func (r *Replica) Restart() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cache.clear()
	r.seq = 0
	r.replay = nil
	r.pending = nil
	r.dropNext = 0
	r.stallUntil = time.Time{}
	r.queries, r.hits = 0, 0
	select {
	case r.notify <- struct{}{}:
	default:
	}
	r.log.Info("replica restarted")
}

// ClearCache empties the prefix cache and publishes AllBlocksCleared, as
// vLLM's reset_prefix_cache does.
func (r *Replica) ClearCache() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.cache.clear()
	r.emitLocked(allBlocksCleared{})
}

// SetHealthy makes GET /health answer 200 (true) or 503 (false).
func (r *Replica) SetHealthy(ok bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.healthy = ok
}

// CachedBlocks is the number of blocks in the prefix cache.
func (r *Replica) CachedBlocks() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cache.len()
}

// Seq is the sequence number the next batch will carry.
func (r *Replica) Seq() int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return int64(r.seq)
}

// Contains reports how many leading full blocks of tokens the replica would
// serve from its cache (for the base model), without touching the LRU order.
func (r *Replica) Contains(tokens []int, cacheSalt string) (matchedBlocks int) {
	ds, _, err := r.hasher.chain(r.cfg.BlockSize, tokens, "", cacheSalt)
	if err != nil {
		return 0
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.cache.match(ds)
}

// BlockHashes returns the engine hashes (uint64 form) this replica gives the
// full blocks of tokens, i.e. what its BlockStored events would carry.
func (r *Replica) BlockHashes(tokens []int, cacheSalt string) ([]uint64, error) {
	return r.hasher.engineHashes(r.cfg.BlockSize, tokens, "", cacheSalt)
}

// Admit runs the cache side of a request without HTTP: it matches tokens
// against the cache, stores the new full blocks (publishing the batch) and
// returns the cached token count the request would report, which as in
// vLLM never covers the prompt's last token (see servedBlocks).
func (r *Replica) Admit(tokens []int, cacheSalt string) (cachedTokens int, err error) {
	return r.admit(tokens, "", cacheSalt)
}

// servedBlocks is how many of a prompt's hits leading cached blocks vLLM
// v1 serves from its cache: the engine must compute at least the prompt's
// last token, whose logits sample the first output token, so
// KVCacheManager.get_computed_blocks looks for a hit of at most n-1
// tokens, that is floor((n-1)/blockSize) blocks. A prompt of exactly k
// full cached blocks is therefore served k-1 of them, and recomputes the
// last one. kvroute's router counts its believed cached tokens by the same
// rule, so the simulation must follow it for believed to equal served.
func servedBlocks(hits, n, blockSize int) int {
	if n == 0 {
		return 0
	}
	return min(hits, (n-1)/blockSize)
}

// admit is the scheduler step of one request: find the longest cached
// prefix, then cache the prompt's full blocks, evicting the least recently
// used blocks as needed, and publish one batch with the removals followed
// by the store, in the order vLLM's block pool emits them. The cached
// token count it returns, and the prefix_cache_hits it counts, follow
// servedBlocks. The cache and its events use every matched block: vLLM
// computes a recomputed last block into a fresh physical block and caches
// it again under the same hash, while the simulation keeps one block per
// hash and publishes no second BlockStored for it, a difference an index
// keyed by hash cannot see.
func (r *Replica) admit(tokens []int, lora, salt string) (cachedTokens int, err error) {
	ds, eks, err := r.hasher.chain(r.cfg.BlockSize, tokens, lora, salt)
	if err != nil {
		return 0, fmt.Errorf("replica: admit: %w", err)
	}
	// A prompt longer than the cache keeps only the blocks that fit.
	if len(ds) > r.cfg.CapacityBlocks {
		ds, eks = ds[:r.cfg.CapacityBlocks], eks[:r.cfg.CapacityBlocks]
	}
	loraID := 0
	for i, name := range r.cfg.LoRAs {
		if name == lora && lora != "" {
			loraID = i + 1
		}
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	hits := r.cache.match(ds)
	cachedTokens = servedBlocks(hits, len(tokens), r.cfg.BlockSize) * r.cfg.BlockSize
	r.queries += uint64(len(tokens))
	r.hits += uint64(cachedTokens)
	evicted := r.cache.admit(ds, hits)

	var events []event
	for _, d := range evicted {
		// One BlockRemoved per freed physical block, as vLLM's
		// _maybe_evict_cached_block does.
		events = append(events, blockRemoved{hashes: []uint64{d.Uint64()}})
	}
	if fresh := ds[hits:]; len(fresh) > 0 {
		st := blockStored{
			hashes:    make([]uint64, len(fresh)),
			tokens:    tokens[hits*r.cfg.BlockSize : len(ds)*r.cfg.BlockSize],
			blockSize: r.cfg.BlockSize,
			loraID:    loraID,
			loraName:  lora,
			extraKeys: eks[hits:],
		}
		for i, d := range fresh {
			st.hashes[i] = d.Uint64()
		}
		if hits > 0 {
			p := ds[hits-1].Uint64()
			st.parent = &p
		}
		events = append(events, st)
	}
	r.emitLocked(events...)
	return cachedTokens, nil
}
