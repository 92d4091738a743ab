package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// piece is a span of text on its way to the model. first records whether
// it begins at offset 0 of the original input, which Metaspace's
// prepend_scheme "first" tests (Hugging Face checks the original offset).
type piece struct {
	text  string
	first bool
}

// preTokenizer splits one piece into the words the model sees, appending
// them to dst. Empty words are never appended.
type preTokenizer interface {
	preTokenize(dst []piece, p piece) []piece
}

// segment is a span [start, end) of a piece and whether a pattern matched it.
type segment struct {
	start, end int
	match      bool
}

// behavior is Hugging Face's SplitDelimiterBehavior.
type behavior int

const (
	removed behavior = iota
	isolated
	mergedWithPrevious
	mergedWithNext
	contiguous
)

func parseBehavior(s string) (behavior, error) {
	switch s {
	case "Removed":
		return removed, nil
	case "Isolated":
		return isolated, nil
	case "MergedWithPrevious":
		return mergedWithPrevious, nil
	case "MergedWithNext":
		return mergedWithNext, nil
	case "Contiguous":
		return contiguous, nil
	}
	return 0, fmt.Errorf("split behavior %q is not supported", s)
}

// segmentsOf turns match offsets into segments covering all of s, the
// shape Hugging Face's Pattern::find_matches returns.
func segmentsOf(s string, matches [][2]int, invert bool) []segment {
	segs := make([]segment, 0, 2*len(matches)+1)
	prev := 0
	for _, m := range matches {
		if m[0] > prev {
			segs = append(segs, segment{prev, m[0], invert})
		}
		segs = append(segs, segment{m[0], m[1], !invert})
		prev = m[1]
	}
	if prev < len(s) {
		segs = append(segs, segment{prev, len(s), invert})
	}
	return segs
}

// charMatches returns the offsets of every character satisfying pred.
func charMatches(s string, pred func(rune) bool) [][2]int {
	var out [][2]int
	for i, r := range s {
		if pred(r) {
			out = append(out, [2]int{i, i + utf8.RuneLen(r)})
		}
	}
	return out
}

// applyBehavior splits p at segs as Hugging Face's NormalizedString::split
// does for the behavior, appending the non-empty parts to dst.
func applyBehavior(dst []piece, p piece, segs []segment, b behavior) []piece {
	var spans []segment // match here means "remove"
	switch b {
	case isolated:
		spans = make([]segment, len(segs))
		for i, s := range segs {
			spans[i] = segment{s.start, s.end, false}
		}
	case removed:
		spans = segs
	case contiguous:
		prevMatch := false
		for _, s := range segs {
			if s.match == prevMatch && len(spans) > 0 {
				spans[len(spans)-1].end = s.end
			} else {
				spans = append(spans, segment{s.start, s.end, false})
			}
			prevMatch = s.match
		}
	case mergedWithPrevious:
		prevMatch := false
		for _, s := range segs {
			if s.match && !prevMatch && len(spans) > 0 {
				spans[len(spans)-1].end = s.end
			} else {
				spans = append(spans, segment{s.start, s.end, false})
			}
			prevMatch = s.match
		}
	case mergedWithNext:
		prevMatch := false
		for i := len(segs) - 1; i >= 0; i-- {
			s := segs[i]
			if s.match && !prevMatch && len(spans) > 0 {
				spans[len(spans)-1].start = s.start
			} else {
				spans = append(spans, segment{s.start, s.end, false})
			}
			prevMatch = s.match
		}
		for i, j := 0, len(spans)-1; i < j; i, j = i+1, j-1 {
			spans[i], spans[j] = spans[j], spans[i]
		}
	}
	for _, s := range spans {
		if s.match || s.end <= s.start {
			continue
		}
		dst = append(dst, piece{text: p.text[s.start:s.end], first: p.first && s.start == 0})
	}
	return dst
}

// splitPre is the Split pre-tokenizer: a regex or literal pattern.
type splitPre struct {
	re       *splitRegex // nil for a literal
	literal  string
	behavior behavior
	invert   bool
}

func (sp *splitPre) preTokenize(dst []piece, p piece) []piece {
	var matches [][2]int
	if sp.re != nil {
		matches = sp.re.findAll(p.text)
	} else if sp.literal != "" {
		for off := 0; ; {
			i := strings.Index(p.text[off:], sp.literal)
			if i < 0 {
				break
			}
			matches = append(matches, [2]int{off + i, off + i + len(sp.literal)})
			off += i + len(sp.literal)
		}
	}
	if sp.behavior == isolated && !sp.invert {
		// The common case, without building segments.
		prev := 0
		for _, m := range matches {
			if m[0] > prev {
				dst = append(dst, piece{p.text[prev:m[0]], p.first && prev == 0})
			}
			dst = append(dst, piece{p.text[m[0]:m[1]], p.first && m[0] == 0})
			prev = m[1]
		}
		if prev < len(p.text) {
			dst = append(dst, piece{p.text[prev:], p.first && prev == 0})
		}
		return dst
	}
	return applyBehavior(dst, p, segmentsOf(p.text, matches, sp.invert), sp.behavior)
}

// charSplitPre splits at every character a predicate accepts.
type charSplitPre struct {
	pred     func(rune) bool
	behavior behavior
}

func (c charSplitPre) preTokenize(dst []piece, p piece) []piece {
	return applyBehavior(dst, p, segmentsOf(p.text, charMatches(p.text, c.pred), false), c.behavior)
}

// whitespacePre is the Whitespace pre-tokenizer: the runs of
// `\w+|[^\w\s]+` under Rust regex's Unicode \w, everything else dropped.
type whitespacePre struct{}

func (whitespacePre) preTokenize(dst []piece, p piece) []piece {
	s := p.text
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if unicode.IsSpace(r) {
			i += n
			continue
		}
		word := isRegexWord(r)
		j := i + n
		for j < len(s) {
			r2, n2 := utf8.DecodeRuneInString(s[j:])
			if unicode.IsSpace(r2) || isRegexWord(r2) != word {
				break
			}
			j += n2
		}
		dst = append(dst, piece{s[i:j], p.first && i == 0})
		i = j
	}
	return dst
}

// isRegexWord is Rust regex's Unicode \w: Alphabetic, marks, decimal
// digits, connector punctuation and the joiners.
func isRegexWord(r rune) bool {
	return unicode.IsLetter(r) || unicode.Is(unicode.Nl, r) || unicode.Is(unicode.Other_Alphabetic, r) ||
		unicode.IsMark(r) || unicode.Is(unicode.Nd, r) || unicode.Is(unicode.Pc, r) ||
		r == '\u200c' || r == '\u200d'
}

// isPunctuation is Hugging Face's is_punc: ASCII punctuation or a Unicode
// punctuation category.
func isPunctuation(r rune) bool {
	return (r < 0x80 && unicode.IsPunct(r)) || (r < 0x80 && unicode.IsSymbol(r)) || unicode.IsPunct(r)
}

// byteLevelPre is the ByteLevel pre-tokenizer: optionally a prefix space
// and the GPT-2 split, then every byte mapped to its printable stand-in.
type byteLevelPre struct {
	addPrefixSpace bool
	re             *splitRegex // GPT-2 pattern when use_regex, else nil
}

// gpt2Pattern is the split ByteLevel applies when use_regex is true.
const gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`

func (bl *byteLevelPre) preTokenize(dst []piece, p piece) []piece {
	if bl.addPrefixSpace && !strings.HasPrefix(p.text, " ") {
		p.text = " " + p.text
	}
	start := len(dst)
	if bl.re != nil {
		dst = (&splitPre{re: bl.re, behavior: isolated}).preTokenize(dst, p)
	} else if p.text != "" {
		dst = append(dst, p)
	}
	for i := start; i < len(dst); i++ {
		dst[i].text = byteLevelEncode(dst[i].text)
	}
	return dst
}

// byteChars is GPT-2's reversible map from bytes to printable characters.
var byteChars = func() (t [256]rune) {
	n := 0
	for b := 0; b < 256; b++ {
		if (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF) {
			t[b] = rune(b)
		} else {
			t[b] = rune(256 + n)
			n++
		}
	}
	return t
}()

func byteLevelEncode(s string) string {
	buf := make([]byte, 0, 2*len(s))
	for i := 0; i < len(s); i++ {
		buf = utf8.AppendRune(buf, byteChars[s[i]])
	}
	return string(buf)
}

// metaspacePre replaces spaces with the replacement character, prepends
// one per prepend_scheme, and optionally splits before each replacement.
type metaspacePre struct {
	replacement rune
	rep         string
	scheme      string // "always", "first" or "never"
	split       bool
}

func (m *metaspacePre) preTokenize(dst []piece, p piece) []piece {
	p.text = strings.ReplaceAll(p.text, " ", m.rep)
	if !strings.HasPrefix(p.text, m.rep) && (m.scheme == "always" || (m.scheme == "first" && p.first)) {
		p.text = m.rep + p.text
	}
	if !m.split {
		if p.text != "" {
			dst = append(dst, p)
		}
		return dst
	}
	rep := m.replacement
	return applyBehavior(dst, p, segmentsOf(p.text, charMatches(p.text, func(r rune) bool { return r == rep }), false), mergedWithNext)
}

type sequencePre []preTokenizer

func (s sequencePre) preTokenize(dst []piece, p piece) []piece {
	cur := []piece{p}
	var next []piece
	for _, stage := range s {
		next = next[:0]
		for _, q := range cur {
			next = stage.preTokenize(next, q)
		}
		cur, next = next, cur
	}
	return append(dst, cur...)
}

type preTokenizerJSON struct {
	Type             string            `json:"type"`
	Pretokenizers    []json.RawMessage `json:"pretokenizers"`
	Pattern          patternJSON       `json:"pattern"`
	Behavior         string            `json:"behavior"`
	Invert           bool              `json:"invert"`
	AddPrefixSpace   *bool             `json:"add_prefix_space"`
	UseRegex         *bool             `json:"use_regex"`
	IndividualDigits bool              `json:"individual_digits"`
	Replacement      string            `json:"replacement"`
	PrependScheme    string            `json:"prepend_scheme"`
	Split            *bool             `json:"split"`
}

func parsePreTokenizer(raw json.RawMessage) (preTokenizer, error) {
	var j preTokenizerJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	switch j.Type {
	case "Sequence":
		seq := make(sequencePre, 0, len(j.Pretokenizers))
		for i, r := range j.Pretokenizers {
			p, err := parsePreTokenizer(r)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			seq = append(seq, p)
		}
		return seq, nil
	case "Split":
		b, err := parseBehavior(j.Behavior)
		if err != nil {
			return nil, fmt.Errorf("Split: %w", err)
		}
		sp := &splitPre{behavior: b, invert: j.Invert}
		switch {
		case j.Pattern.String != nil:
			sp.literal = *j.Pattern.String
		case j.Pattern.Regex != nil:
			if sp.re, err = compileSplitRegex(*j.Pattern.Regex); err != nil {
				return nil, fmt.Errorf("Split: %w", err)
			}
		default:
			return nil, fmt.Errorf("Split: no pattern")
		}
		return sp, nil
	case "ByteLevel":
		bl := &byteLevelPre{addPrefixSpace: j.AddPrefixSpace == nil || *j.AddPrefixSpace}
		if j.UseRegex == nil || *j.UseRegex {
			re, err := compileSplitRegex(gpt2Pattern)
			if err != nil {
				return nil, fmt.Errorf("ByteLevel: %w", err)
			}
			bl.re = re
		}
		return bl, nil
	case "Digits":
		b := contiguous
		if j.IndividualDigits {
			b = isolated
		}
		return charSplitPre{pred: unicode.IsNumber, behavior: b}, nil
	case "Whitespace":
		return whitespacePre{}, nil
	case "WhitespaceSplit":
		return charSplitPre{pred: unicode.IsSpace, behavior: removed}, nil
	case "Punctuation":
		b := isolated
		if j.Behavior != "" {
			var err error
			if b, err = parseBehavior(j.Behavior); err != nil {
				return nil, fmt.Errorf("Punctuation: %w", err)
			}
		}
		return charSplitPre{pred: isPunctuation, behavior: b}, nil
	case "Metaspace":
		m := &metaspacePre{scheme: "always", split: j.Split == nil || *j.Split}
		rep := j.Replacement
		if rep == "" {
			rep = "▁"
		}
		r, n := utf8.DecodeRuneInString(rep)
		if n != len(rep) {
			return nil, fmt.Errorf("Metaspace: replacement %q is not one character", rep)
		}
		m.replacement, m.rep = r, rep
		switch j.PrependScheme {
		case "", "always":
		case "first", "never":
			m.scheme = j.PrependScheme
		default:
			return nil, fmt.Errorf("Metaspace: prepend_scheme %q is not supported", j.PrependScheme)
		}
		if j.PrependScheme == "" && j.AddPrefixSpace != nil && !*j.AddPrefixSpace {
			m.scheme = "never" // the legacy add_prefix_space: false
		}
		return m, nil
	}
	return nil, fmt.Errorf("pre-tokenizer type %q is not supported", j.Type)
}
