package tokenizer

import (
	"errors"
	"hash/maphash"
	"strings"
	"sync"
	"unicode/utf8"
)

// Tokenizer encodes text as Hugging Face's Rust tokenizer does for one
// tokenizer.json. It is immutable after loading, apart from an internal
// word cache, and safe for concurrent use.
type Tokenizer struct {
	model        *bpe
	normalizer   normalizer
	preTokenizer preTokenizer
	post         postProcessor
	decoder      decoder
	added        *addedVocab

	words wordCache
}

// ErrInvalidUTF8 is returned for text that is not valid UTF-8; Hugging
// Face's tokenizer only ever sees valid strings, so there is no parity to
// keep for anything else.
var ErrInvalidUTF8 = errors.New("tokenizer: encode: text is not valid UTF-8")

func (t *Tokenizer) init() {
	t.words.init()
}

// Encode returns the ids of text. With addSpecialTokens the
// post-processor's template applies (for example a leading <bos>); added
// and special tokens written in the text are recognised either way, as in
// Hugging Face's encode.
func (t *Tokenizer) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	if !utf8.ValidString(text) {
		return nil, ErrInvalidUTF8
	}
	ids := make([]uint32, 0, len(text)/3+4)
	for _, sp := range t.added.find(nil, text, t.added.raw) {
		if sp.isToken {
			ids = append(ids, sp.id)
			continue
		}
		ids = t.encodeSegment(ids, text[sp.start:sp.end], sp.start == 0)
	}
	return t.finish(ids, addSpecialTokens), nil
}

func (t *Tokenizer) finish(ids []uint32, addSpecialTokens bool) []uint32 {
	if addSpecialTokens && t.post != nil {
		return t.post.process(ids)
	}
	return ids
}

// encodeSegment encodes text lying between two non-normalized added
// tokens. Its ids depend only on the text and on whether it starts the
// input (first), which is what makes segments cacheable.
func (t *Tokenizer) encodeSegment(dst []uint32, seg string, first bool) []uint32 {
	s := seg
	if t.normalizer != nil {
		s = t.normalizer.normalize(seg)
	}
	if t.added.norm == nil {
		return t.encodePiece(dst, piece{text: s, first: first})
	}
	for _, sp := range t.added.find(nil, s, t.added.norm) {
		if sp.isToken {
			dst = append(dst, sp.id)
			continue
		}
		dst = t.encodePiece(dst, piece{text: s[sp.start:sp.end], first: first && sp.start == 0})
	}
	return dst
}

// encodePiece pre-tokenizes normalized text and runs the model on each word.
func (t *Tokenizer) encodePiece(dst []uint32, p piece) []uint32 {
	if p.text == "" {
		return dst
	}
	if t.preTokenizer == nil {
		return t.encodeWord(dst, p.text)
	}
	var buf [32]piece
	for _, w := range t.preTokenizer.preTokenize(buf[:0], p) {
		dst = t.encodeWord(dst, w.text)
	}
	return dst
}

// maxCachedWord is the longest word the word cache keeps, as in Hugging
// Face's BPE cache: long words are rare and would crowd it.
const maxCachedWord = 256

func (t *Tokenizer) encodeWord(dst []uint32, w string) []uint32 {
	if len(w) >= maxCachedWord {
		return t.model.tokenize(dst, w)
	}
	if ids, ok := t.words.get(w); ok {
		return append(dst, ids...)
	}
	start := len(dst)
	dst = t.model.tokenize(dst, w)
	t.words.put(w, dst[start:])
	return dst
}

// TokenID returns the id of a token string, added tokens first.
func (t *Tokenizer) TokenID(s string) (uint32, bool) {
	if id, ok := t.added.byContent[s]; ok {
		return id, true
	}
	id, ok := t.model.vocab[s]
	return id, ok
}

// VocabSize is one more than the largest id the tokenizer can produce,
// counting the model's vocabulary and the added tokens.
func (t *Tokenizer) VocabSize() int {
	n := len(t.model.vocabR)
	for id := range t.added.byID {
		n = max(n, int(id)+1)
	}
	return n
}

// Decode returns the text of ids, special tokens included, through the
// tokenizer's decoder. Unknown ids are skipped, as in Hugging Face.
func (t *Tokenizer) Decode(ids []uint32) string {
	tokens := make([]string, 0, len(ids))
	for _, id := range ids {
		if a, ok := t.added.byID[id]; ok {
			tokens = append(tokens, a.content)
		} else if int(id) < len(t.model.vocabR) && t.model.vocabR[id] != "" {
			tokens = append(tokens, t.model.vocabR[id])
		}
	}
	if t.decoder == nil {
		return strings.Join(tokens, " ")
	}
	return strings.Join(t.decoder.decodeChain(tokens), "")
}

// wordCache remembers the ids of recent words. It is sharded so that
// concurrent encoders rarely contend, and stops admitting words when a
// shard is full, like Hugging Face's cache: the hot words of a language
// arrive early.
type wordCache struct {
	seed   maphash.Seed
	shards [wordShards]wordShard
}

const (
	wordShards    = 16
	wordsPerShard = 4096
)

type wordShard struct {
	mu sync.RWMutex
	m  map[string][]uint32
}

func (c *wordCache) init() {
	c.seed = maphash.MakeSeed()
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32)
	}
}

func (c *wordCache) shard(w string) *wordShard {
	return &c.shards[maphash.String(c.seed, w)%wordShards]
}

func (c *wordCache) get(w string) ([]uint32, bool) {
	s := c.shard(w)
	s.mu.RLock()
	ids, ok := s.m[w]
	s.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []uint32) {
	s := c.shard(w)
	s.mu.Lock()
	if len(s.m) < wordsPerShard {
		s.m[strings.Clone(w)] = append([]uint32(nil), ids...)
	}
	s.mu.Unlock()
}
