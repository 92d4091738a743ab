package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json's added_tokens.
type addedToken struct {
	id         uint32
	content    string
	singleWord bool
	lstrip     bool
	rstrip     bool
	normalized bool
	special    bool
}

// addedVocab finds added tokens in text the way Hugging Face's
// AddedVocabulary does: non-normalized tokens are matched on the raw
// text, normalized ones on each remaining piece after normalization, both
// leftmost-longest.
type addedVocab struct {
	tokens    []addedToken
	byContent map[string]uint32
	byID      map[uint32]*addedToken
	raw       *matcher // non-normalized tokens; nil when none
	norm      *matcher // normalized tokens, by normalized content; nil when none
}

func newAddedVocab(list []addedTokenJSON, m *bpe, n normalizer) (*addedVocab, error) {
	av := &addedVocab{byContent: map[string]uint32{}, byID: map[uint32]*addedToken{}}
	// Ids are assigned as Hugging Face's add_tokens does, ignoring the ids
	// written in the file: the id the tokenizer already has for the
	// string (an earlier added token, else the model's), else the next
	// one after the model's vocabulary.
	nextID := uint32(len(m.vocab))
	var rawPats, normPats []matcherPattern
	for _, j := range list {
		if j.Content == "" {
			continue
		}
		id, ok := av.byContent[j.Content]
		if !ok {
			id, ok = m.vocab[j.Content]
		}
		if !ok {
			id = nextID
			nextID++
		}
		t := addedToken{id: id, content: j.Content, singleWord: j.SingleWord, lstrip: j.LStrip,
			rstrip: j.RStrip, normalized: j.Normalized, special: j.Special}
		av.tokens = append(av.tokens, t)
		av.byContent[j.Content] = id
	}
	for i := range av.tokens {
		t := &av.tokens[i]
		av.byID[t.id] = t
	}
	// Later entries for the same id win, as in Hugging Face's map.
	for id, t := range av.byID {
		if t.normalized {
			pat := t.content
			if n != nil {
				pat = n.normalize(pat)
			}
			normPats = append(normPats, matcherPattern{pat, id})
		} else {
			rawPats = append(rawPats, matcherPattern{t.content, id})
		}
	}
	av.raw = newMatcher(rawPats)
	av.norm = newMatcher(normPats)
	return av, nil
}

// span is a piece of input: either an added token (isToken, id) or text
// still to be tokenized, with its byte offsets in the string it came from.
type span struct {
	start, end int
	isToken    bool
	id         uint32
}

// find splits s at the added tokens m matches, applying each token's
// single_word, lstrip and rstrip exactly as Hugging Face's find_matches.
func (av *addedVocab) find(dst []span, s string, m *matcher) []span {
	if s == "" {
		return dst
	}
	if m == nil {
		return append(dst, span{start: 0, end: len(s)})
	}
	startOffset := 0
	pos := 0
	for {
		start, stop, id, ok := m.next(s, pos)
		if !ok {
			break
		}
		pos = stop
		t := av.byID[id]
		if t.singleWord {
			startSpace := start == 0 || !endsWithWord(s[:start])
			stopSpace := stop == len(s) || !startsWithWord(s[stop:])
			if !startSpace || !stopSpace {
				continue
			}
		}
		if t.lstrip {
			start = max(leftmostSpaceAtEnd(s[:start]), startOffset)
		}
		if t.rstrip {
			// The automaton still resumes after the unstripped match.
			stop += rightmostSpaceAtStart(s[stop:])
		}
		if startOffset < start {
			dst = append(dst, span{start: startOffset, end: start})
		}
		dst = append(dst, span{start: start, end: stop, isToken: true, id: id})
		startOffset = stop
	}
	if startOffset < len(s) {
		dst = append(dst, span{start: startOffset, end: len(s)})
	}
	return dst
}

// isWordChar is the Rust regex crate's Unicode \w.
func isWordChar(r rune) bool { return isRegexWord(r) }

func endsWithWord(s string) bool {
	r, n := utf8.DecodeLastRuneInString(s)
	return n > 0 && isWordChar(r)
}

func startsWithWord(s string) bool {
	r, n := utf8.DecodeRuneInString(s)
	return n > 0 && isWordChar(r)
}

// leftmostSpaceAtEnd is the start of the run of whitespace ending s.
func leftmostSpaceAtEnd(s string) int {
	i := len(s)
	for i > 0 {
		r, n := utf8.DecodeLastRuneInString(s[:i])
		if !unicode.IsSpace(r) {
			break
		}
		i -= n
	}
	return i
}

// rightmostSpaceAtStart is the length of the run of whitespace starting s.
func rightmostSpaceAtStart(s string) int {
	i := 0
	for i < len(s) {
		r, n := utf8.DecodeRuneInString(s[i:])
		if !unicode.IsSpace(r) {
			break
		}
		i += n
	}
	return i
}

type matcherPattern struct {
	s  string
	id uint32
}

// matcher is a byte trie answering leftmost-longest queries, the match
// kind Hugging Face's Aho–Corasick automaton uses. Trying each start
// position in turn and walking the trie as far as it goes is
// leftmost-longest by construction; a table of possible first bytes skips
// most positions without touching the trie.
type matcher struct {
	first [256]bool
	// firsts lists the possible first bytes when they are few (a chat
	// template's markers mostly start with '<'): candidates are then found
	// with strings.IndexByte, which is vectorized, instead of a byte loop.
	firsts []byte
	nodes  []trieNode
	edges  map[uint64]int32 // node<<8|byte -> child node
}

// maxFirsts is the most first bytes searched with IndexByte, one search
// each; with more, the table loop is quicker.
const maxFirsts = 4

type trieNode struct {
	id       uint32
	terminal bool
}

func newMatcher(pats []matcherPattern) *matcher {
	if len(pats) == 0 {
		return nil
	}
	m := &matcher{nodes: []trieNode{{}}, edges: map[uint64]int32{}}
	for _, p := range pats {
		if p.s == "" {
			continue
		}
		m.first[p.s[0]] = true
		cur := int32(0)
		for i := 0; i < len(p.s); i++ {
			k := uint64(cur)<<8 | uint64(p.s[i])
			nxt, ok := m.edges[k]
			if !ok {
				nxt = int32(len(m.nodes))
				m.nodes = append(m.nodes, trieNode{})
				m.edges[k] = nxt
			}
			cur = nxt
		}
		m.nodes[cur] = trieNode{id: p.id, terminal: true}
	}
	for b := range 256 {
		if m.first[b] {
			m.firsts = append(m.firsts, byte(b))
		}
	}
	if len(m.firsts) > maxFirsts {
		m.firsts = nil
	}
	return m
}

// candidate returns the first position at or after pos whose byte may
// start a match, or -1.
func (m *matcher) candidate(s string, pos int) int {
	if m.firsts == nil {
		for i := pos; i < len(s); i++ {
			if m.first[s[i]] {
				return i
			}
		}
		return -1
	}
	best := -1
	rest := s[pos:]
	for _, b := range m.firsts {
		if j := strings.IndexByte(rest, b); j >= 0 && (best < 0 || j < best) {
			best = j
			rest = rest[:j] // a later byte can only win before this one
		}
	}
	if best < 0 {
		return -1
	}
	return pos + best
}

// next finds the leftmost-longest match starting at or after pos.
func (m *matcher) next(s string, pos int) (start, end int, id uint32, ok bool) {
	for i := pos; i < len(s); i++ {
		if i = m.candidate(s, i); i < 0 {
			break
		}
		cur := int32(0)
		best := -1
		var bestID uint32
		for j := i; j < len(s); j++ {
			nxt, found := m.edges[uint64(cur)<<8|uint64(s[j])]
			if !found {
				break
			}
			cur = nxt
			if m.nodes[cur].terminal {
				best, bestID = j+1, m.nodes[cur].id
			}
		}
		if best >= 0 {
			return i, best, bestID, true
		}
	}
	return 0, 0, 0, false
}
