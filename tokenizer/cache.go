package tokenizer

import (
	"container/list"
	"sync"
	"sync/atomic"
	"unicode/utf8"
)

// Cache remembers the ids of text segments so that re-encoding a growing
// conversation costs only its new text. Chat and agent traffic resends
// the whole history every turn; the history's segments hit.
//
// Segments are the text between non-normalized added tokens (a chat
// template's role markers are such special tokens). No BPE merge, and no
// normalizer or pre-tokenizer, crosses those boundaries in Hugging Face's
// pipeline, so a segment's ids depend only on its text and on whether it
// starts the input (Metaspace's prepend_scheme "first" looks at that),
// which is the key. Encode through a Cache therefore equals
// Tokenizer.Encode on every input; the tests check it.
//
// Memory is bounded by a byte budget with least-recently-used eviction.
// A Cache is safe for concurrent use.
type Cache struct {
	tok      *Tokenizer
	maxBytes int64

	mu      sync.Mutex
	entries map[cacheKey]*list.Element
	lru     list.List // front is most recent; values are *cacheEntry
	bytes   int64

	hits, misses, evictions atomic.Uint64
}

type cacheKey struct {
	text  string
	first bool
}

type cacheEntry struct {
	key cacheKey
	ids []uint32
}

// entryOverhead approximates the bytes an entry costs beyond its text and
// ids: the map slot, the list element and the slice headers.
const entryOverhead = 128

// minCachedSegment is the shortest segment worth a lookup: shorter ones
// (a newline between two markers) encode faster than the bookkeeping.
const minCachedSegment = 16

// CacheStats are a Cache's counters since it was made.
type CacheStats struct {
	Hits      uint64 // segments answered from the cache
	Misses    uint64 // segments encoded and then stored
	Evictions uint64 // entries dropped to stay within the budget
	Entries   int    // entries held now
	Bytes     int64  // approximate bytes held now
}

// NewCache returns a cache for tok holding about maxBytes of segments and
// their ids.
func NewCache(tok *Tokenizer, maxBytes int64) *Cache {
	return &Cache{tok: tok, maxBytes: maxBytes, entries: make(map[cacheKey]*list.Element)}
}

// Tokenizer is the tokenizer the cache encodes with.
func (c *Cache) Tokenizer() *Tokenizer { return c.tok }

// Encode is Tokenizer.Encode, answering segments seen before from the cache.
func (c *Cache) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	if !utf8.ValidString(text) {
		return nil, ErrInvalidUTF8
	}
	t := c.tok
	ids := make([]uint32, 0, len(text)/3+4)
	for _, sp := range t.added.find(nil, text, t.added.raw) {
		if sp.isToken {
			ids = append(ids, sp.id)
			continue
		}
		seg := text[sp.start:sp.end]
		first := sp.start == 0
		if len(seg) < minCachedSegment {
			ids = t.encodeSegment(ids, seg, first)
			continue
		}
		key := cacheKey{seg, first}
		if cached, ok := c.get(key); ok {
			c.hits.Add(1)
			ids = append(ids, cached...)
			continue
		}
		c.misses.Add(1)
		start := len(ids)
		ids = t.encodeSegment(ids, seg, first)
		c.put(key, ids[start:])
	}
	return t.finish(ids, addSpecialTokens), nil
}

func (c *Cache) get(k cacheKey) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.entries[k]
	if !ok {
		return nil, false
	}
	c.lru.MoveToFront(el)
	return el.Value.(*cacheEntry).ids, true
}

func entryCost(k cacheKey, ids []uint32) int64 {
	return int64(len(k.text) + 4*len(ids) + entryOverhead)
}

func (c *Cache) put(k cacheKey, ids []uint32) {
	cost := entryCost(k, ids)
	if cost > c.maxBytes {
		return
	}
	// Own copies: the key must not pin the caller's whole input string,
	// and ids must not alias the caller's result.
	e := &cacheEntry{key: cacheKey{string([]byte(k.text)), k.first}, ids: append([]uint32(nil), ids...)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[k]; ok {
		return // a concurrent miss stored it first
	}
	c.entries[e.key] = c.lru.PushFront(e)
	c.bytes += cost
	for c.bytes > c.maxBytes {
		old := c.lru.Back()
		oe := old.Value.(*cacheEntry)
		c.lru.Remove(old)
		delete(c.entries, oe.key)
		c.bytes -= entryCost(oe.key, oe.ids)
		c.evictions.Add(1)
	}
}

// Stats returns the cache's counters.
func (c *Cache) Stats() CacheStats {
	c.mu.Lock()
	n, b := len(c.entries), c.bytes
	c.mu.Unlock()
	return CacheStats{
		Hits:      c.hits.Load(),
		Misses:    c.misses.Load(),
		Evictions: c.evictions.Load(),
		Entries:   n,
		Bytes:     b,
	}
}
