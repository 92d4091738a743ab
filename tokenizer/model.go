package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"unicode/utf8"
)

// bpe is a byte-pair-encoding model as Hugging Face's BPE applies it:
// a word starts as one symbol per character (or per byte, through
// byte_fallback), and the lowest-ranked adjacent pair merges first, ties
// going to the leftmost pair.
type bpe struct {
	vocab  map[string]uint32
	vocabR []string // id -> token; "" where the vocabulary has a gap
	merges map[uint64]merge

	unk          uint32
	hasUnk       bool
	fuseUnk      bool
	byteFallback bool
	byteIDs      [256]int64 // id of "<0xXX>", or -1
	prefix       string     // continuing_subword_prefix
	suffix       string     // end_of_word_suffix
	ignoreMerges bool
}

// merge is what a mergeable pair becomes: its rank (lower merges first)
// and the id of the merged symbol.
type merge struct {
	rank uint32
	id   uint32
}

func pairKey(a, b uint32) uint64 { return uint64(a)<<32 | uint64(b) }

type bpeJSON struct {
	Type                    string            `json:"type"`
	Dropout                 *float64          `json:"dropout"`
	UnkToken                *string           `json:"unk_token"`
	ContinuingSubwordPrefix *string           `json:"continuing_subword_prefix"`
	EndOfWordSuffix         *string           `json:"end_of_word_suffix"`
	FuseUnk                 bool              `json:"fuse_unk"`
	ByteFallback            bool              `json:"byte_fallback"`
	IgnoreMerges            bool              `json:"ignore_merges"`
	Vocab                   map[string]uint32 `json:"vocab"`
	Merges                  []json.RawMessage `json:"merges"`
}

func parseModel(raw json.RawMessage) (*bpe, error) {
	if isNull(raw) {
		return nil, errors.New("missing")
	}
	typ, err := componentType(raw)
	if err != nil {
		return nil, err
	}
	if typ != "BPE" && typ != "" {
		return nil, fmt.Errorf("model type %q is not supported (only BPE)", typ)
	}
	var m bpeJSON
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, err
	}
	if m.Merges == nil {
		return nil, errors.New("BPE model without merges")
	}
	if m.Dropout != nil && *m.Dropout != 0 {
		return nil, fmt.Errorf("BPE dropout %v is not supported (it makes encoding random)", *m.Dropout)
	}
	b := &bpe{
		vocab:        m.Vocab,
		merges:       make(map[uint64]merge, len(m.Merges)),
		fuseUnk:      m.FuseUnk,
		byteFallback: m.ByteFallback,
		ignoreMerges: m.IgnoreMerges,
	}
	if m.ContinuingSubwordPrefix != nil {
		b.prefix = *m.ContinuingSubwordPrefix
	}
	if m.EndOfWordSuffix != nil {
		b.suffix = *m.EndOfWordSuffix
	}
	var maxID uint32
	for _, id := range b.vocab {
		maxID = max(maxID, id)
	}
	if len(b.vocab) > 0 {
		b.vocabR = make([]string, maxID+1)
	}
	for tok, id := range b.vocab {
		b.vocabR[id] = tok
	}
	if m.UnkToken != nil {
		id, ok := b.vocab[*m.UnkToken]
		if !ok {
			return nil, fmt.Errorf("unk_token %q is not in the vocabulary", *m.UnkToken)
		}
		b.unk, b.hasUnk = id, true
	}
	for i := range b.byteIDs {
		b.byteIDs[i] = -1
		if id, ok := b.vocab[fmt.Sprintf("<0x%02X>", i)]; ok {
			b.byteIDs[i] = int64(id)
		}
	}
	rank := uint32(0)
	for i, raw := range m.Merges {
		l, r, err := parseMerge(raw)
		if err != nil {
			return nil, fmt.Errorf("merge %d: %w", i+1, err)
		}
		if strings.HasPrefix(l, "#version") && r == "" {
			continue // a header line of a legacy merges.txt
		}
		a, ok := b.vocab[l]
		if !ok {
			return nil, fmt.Errorf("merge %d: %q is not in the vocabulary", i+1, l)
		}
		c, ok := b.vocab[r]
		if !ok {
			return nil, fmt.Errorf("merge %d: %q is not in the vocabulary", i+1, r)
		}
		// The merged token drops the right side's continuing-subword
		// prefix, which Hugging Face assumes every right side carries.
		joined := l
		if len(r) > len(b.prefix) {
			joined = l + r[len(b.prefix):]
		}
		id, ok := b.vocab[joined]
		if !ok {
			return nil, fmt.Errorf("merge %d: %q is not in the vocabulary", i+1, joined)
		}
		// A repeated pair keeps its last rank, as Hugging Face's map does.
		b.merges[pairKey(a, c)] = merge{rank: rank, id: id}
		rank++
	}
	return b, nil
}

// parseMerge accepts a merge either as the legacy "a b" string or as a
// two-element list.
func parseMerge(raw json.RawMessage) (string, string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		if strings.HasPrefix(s, "#version") {
			return s, "", nil
		}
		parts := strings.Split(s, " ")
		if len(parts) != 2 {
			return "", "", fmt.Errorf("%q is not two tokens separated by one space", s)
		}
		return parts[0], parts[1], nil
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil {
		return "", "", err
	}
	if len(pair) != 2 {
		return "", "", fmt.Errorf("%d tokens, want 2", len(pair))
	}
	return pair[0], pair[1], nil
}

// symbol is one node of the doubly linked list a word is merged in.
type symbol struct {
	id         uint32
	prev, next int32
	size       int32 // bytes of the word covered; 0 once merged away
}

// mergeItem is a candidate merge of the symbol at pos with its successor.
type mergeItem struct {
	rank uint32
	pos  int32
	id   uint32
}

func (a mergeItem) less(b mergeItem) bool {
	if a.rank != b.rank {
		return a.rank < b.rank
	}
	return a.pos < b.pos
}

// mergeHeap is a binary min-heap of candidate merges. It is hand-rolled
// rather than container/heap to avoid interface calls in the hot loop.
type mergeHeap []mergeItem

func (h *mergeHeap) push(x mergeItem) {
	*h = append(*h, x)
	s := *h
	i := len(s) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !s[i].less(s[p]) {
			break
		}
		s[i], s[p] = s[p], s[i]
		i = p
	}
}

func (h *mergeHeap) pop() mergeItem {
	s := *h
	top := s[0]
	n := len(s) - 1
	s[0] = s[n]
	s = s[:n]
	i := 0
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		m := l
		if r := l + 1; r < n && s[r].less(s[l]) {
			m = r
		}
		if !s[m].less(s[i]) {
			break
		}
		s[i], s[m] = s[m], s[i]
		i = m
	}
	*h = s
	return top
}

// tokenize appends the ids of one pre-tokenized word to dst. The heap
// merge is O(n log n) in the word's length, so a long run of one character
// does not go quadratic.
func (b *bpe) tokenize(dst []uint32, word string) []uint32 {
	if word == "" {
		return dst
	}
	if b.ignoreMerges {
		if id, ok := b.vocab[word]; ok {
			return append(dst, id)
		}
	}
	syms := b.initialSymbols(word)
	if len(syms) > 1 {
		b.mergeAll(syms)
	}
	for i := int32(0); i >= 0 && int(i) < len(syms); i = syms[i].next {
		dst = append(dst, syms[i].id)
	}
	return dst
}

// initialSymbols splits a word into its characters' ids, falling back to
// byte tokens or the unknown token the way Hugging Face's merge_word does.
func (b *bpe) initialSymbols(word string) []symbol {
	syms := make([]symbol, 0, len(word))
	add := func(id uint32, size int) {
		syms = append(syms, symbol{id: id, size: int32(size)})
	}
	var unkSize int
	pendingUnk := false
	var key []byte
	for i := 0; i < len(word); {
		_, n := utf8.DecodeRuneInString(word[i:])
		end := i + n
		ch := word[i:end]
		start := i
		i = end
		first, last := start == 0, end == len(word)
		s := ch
		if (!first && b.prefix != "") || (last && b.suffix != "") {
			key = key[:0]
			if !first {
				key = append(key, b.prefix...)
			}
			key = append(key, ch...)
			if last {
				key = append(key, b.suffix...)
			}
			s = string(key)
		}
		if id, ok := b.vocab[s]; ok {
			if pendingUnk {
				add(b.unk, unkSize)
				pendingUnk = false
			}
			add(id, len(ch))
			continue
		}
		if b.byteFallback {
			all := true
			for j := 0; j < len(s); j++ {
				if b.byteIDs[s[j]] < 0 {
					all = false
					break
				}
			}
			if all {
				// Hugging Face leaves a pending unknown token pending here,
				// so it lands after these bytes; reproduce that.
				for j := 0; j < len(s); j++ {
					add(uint32(b.byteIDs[s[j]]), 1)
				}
				continue
			}
		}
		if b.hasUnk {
			switch {
			case pendingUnk && b.fuseUnk:
				unkSize += len(ch)
			case pendingUnk:
				add(b.unk, unkSize)
				unkSize = len(ch)
			default:
				pendingUnk, unkSize = true, len(ch)
			}
		}
	}
	if pendingUnk {
		add(b.unk, unkSize)
	}
	for i := range syms {
		syms[i].prev = int32(i - 1)
		syms[i].next = int32(i + 1)
	}
	if n := len(syms); n > 0 {
		syms[n-1].next = -1
	}
	return syms
}

// mergeAll applies merges in rank order until none applies. Merged-away
// symbols stay in the slice with size 0 and are skipped by the caller
// walking next links from index 0 (which is never merged away, since a
// merge keeps its left symbol).
func (b *bpe) mergeAll(syms []symbol) {
	h := make(mergeHeap, 0, len(syms))
	for i := 0; i+1 < len(syms); i++ {
		if m, ok := b.merges[pairKey(syms[i].id, syms[i+1].id)]; ok {
			h.push(mergeItem{rank: m.rank, pos: int32(i), id: m.id})
		}
	}
	for len(h) > 0 {
		top := h.pop()
		cur := &syms[top.pos]
		if cur.size == 0 || cur.next < 0 {
			continue
		}
		nextPos := cur.next
		right := syms[nextPos]
		if m, ok := b.merges[pairKey(cur.id, right.id)]; !ok || m.id != top.id {
			continue // stale: one side merged since this entry was pushed
		}
		cur.id = top.id
		cur.size += right.size
		cur.next = right.next
		syms[nextPos].size = 0
		if right.next >= 0 {
			syms[right.next].prev = top.pos
		}
		if cur.prev >= 0 {
			if m, ok := b.merges[pairKey(syms[cur.prev].id, cur.id)]; ok {
				h.push(mergeItem{rank: m.rank, pos: cur.prev, id: m.id})
			}
		}
		if cur.next >= 0 {
			if m, ok := b.merges[pairKey(cur.id, syms[cur.next].id)]; ok {
				h.push(mergeItem{rank: m.rank, pos: top.pos, id: m.id})
			}
		}
	}
}
