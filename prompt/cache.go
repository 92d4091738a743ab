package prompt

import (
	"container/list"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"slices"
	"sync"

	"github.com/kvroute/kvroute"
)

// remoteCache remembers remote answers, least recently used first out
// within a byte budget: a remote tokenization is a round trip and CPU on
// a replica's API server, and clients resend the same prompts.
type remoteCache struct {
	mu    sync.Mutex
	max   int64
	bytes int64
	byKey map[string]*list.Element
	lru   list.List // front: most recent; values are *remoteEntry
}

type remoteEntry struct {
	key string
	ids []uint32
}

func newRemoteCache(maxBytes int64) *remoteCache {
	return &remoteCache{max: maxBytes, byKey: make(map[string]*list.Element)}
}

func entryBytes(e *remoteEntry) int64 { return int64(len(e.key) + 4*len(e.ids) + 96) }

func (c *remoteCache) get(key string) ([]uint32, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.byKey[key]
	if !ok {
		return nil, false
	}
	c.lru.MoveToFront(el)
	return slices.Clone(el.Value.(*remoteEntry).ids), true
}

func (c *remoteCache) put(key string, ids []uint32) {
	e := &remoteEntry{key: key, ids: slices.Clone(ids)}
	size := entryBytes(e)
	if size > c.max {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if el, ok := c.byKey[key]; ok {
		c.bytes -= entryBytes(el.Value.(*remoteEntry))
		c.lru.Remove(el)
	}
	c.byKey[key] = c.lru.PushFront(e)
	c.bytes += size
	for c.bytes > c.max {
		old := c.lru.Back()
		oe := old.Value.(*remoteEntry)
		c.lru.Remove(old)
		delete(c.byKey, oe.key)
		c.bytes -= entryBytes(oe)
	}
}

// requestKey is a digest of everything that changes a tokenization.
func requestKey(r kvroute.TokenizeRequest) string {
	h := sha256.New()
	field := func(b []byte) {
		var n [8]byte
		binary.LittleEndian.PutUint64(n[:], uint64(len(b)))
		h.Write(n[:])
		h.Write(b)
	}
	flag := func(b *bool) []byte {
		switch {
		case b == nil:
			return []byte{2}
		case *b:
			return []byte{1}
		}
		return []byte{0}
	}
	field([]byte(r.Model))
	if r.Prompt != nil {
		field([]byte("p"))
		field([]byte(*r.Prompt))
	} else {
		field([]byte("c"))
		field(r.Messages)
		field(r.Tools)
		field(r.Documents)
		field(r.ChatTemplateKwargs)
		field([]byte(r.ReasoningEffort))
	}
	field(flag(r.AddGenerationPrompt))
	field(flag(&r.ContinueFinalMessage))
	field(flag(r.AddSpecialTokens))
	return hex.EncodeToString(h.Sum(nil))
}
