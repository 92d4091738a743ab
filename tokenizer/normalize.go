package tokenizer

import (
	"encoding/json"
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/text/unicode/norm"
)

// normalizer rewrites one piece of text. Hugging Face tracks alignments
// to the original text as it goes; encoding needs only the result, so
// these return strings.
type normalizer interface {
	normalize(s string) string
}

type unicodeNorm struct{ form norm.Form }

func (n unicodeNorm) normalize(s string) string { return n.form.String(s) }

// replaceNorm replaces every non-overlapping match, left to right.
type replaceNorm struct {
	literal string // when re is nil
	re      *splitRegex
	content string
}

func (n replaceNorm) normalize(s string) string {
	if n.re == nil {
		if n.literal == "" {
			return s
		}
		return strings.ReplaceAll(s, n.literal, n.content)
	}
	var b strings.Builder
	prev := 0
	for _, m := range n.re.findAll(s) {
		b.WriteString(s[prev:m[0]])
		b.WriteString(n.content)
		prev = m[1]
	}
	if prev == 0 {
		return s
	}
	b.WriteString(s[prev:])
	return b.String()
}

// prependNorm prepends to non-empty text only, as Hugging Face does.
type prependNorm struct{ prepend string }

func (n prependNorm) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.prepend + s
}

// stripNorm trims Unicode White_Space, Rust's char::is_whitespace.
type stripNorm struct{ left, right bool }

func (n stripNorm) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}

// lowercaseNorm lower-cases character by character, as Hugging Face
// does with Rust's char::to_lowercase: no context-dependent rules (a
// final capital sigma becomes σ, not ς), and U+0130 becomes two
// characters, the only unconditional multi-character lower case.
type lowercaseNorm struct{}

func (lowercaseNorm) normalize(s string) string {
	if !strings.ContainsRune(s, 'İ') {
		return strings.Map(unicode.ToLower, s)
	}
	var b strings.Builder
	for _, r := range s {
		if r == 'İ' {
			b.WriteString("i\u0307")
		} else {
			b.WriteRune(unicode.ToLower(r))
		}
	}
	return b.String()
}

type sequenceNorm []normalizer

func (n sequenceNorm) normalize(s string) string {
	for _, c := range n {
		s = c.normalize(s)
	}
	return s
}

// patternJSON is Hugging Face's pattern: {"String": "..."} or {"Regex": "..."}.
type patternJSON struct {
	String *string `json:"String"`
	Regex  *string `json:"Regex"`
}

type normalizerJSON struct {
	Type        string            `json:"type"`
	Normalizers []json.RawMessage `json:"normalizers"`
	Pattern     patternJSON       `json:"pattern"`
	Content     string            `json:"content"`
	Prepend     string            `json:"prepend"`
	StripLeft   bool              `json:"strip_left"`
	StripRight  bool              `json:"strip_right"`
}

func parseNormalizer(raw json.RawMessage) (normalizer, error) {
	var j normalizerJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	switch j.Type {
	case "NFC":
		return unicodeNorm{norm.NFC}, nil
	case "NFD":
		return unicodeNorm{norm.NFD}, nil
	case "NFKC":
		return unicodeNorm{norm.NFKC}, nil
	case "NFKD":
		return unicodeNorm{norm.NFKD}, nil
	case "Lowercase":
		return lowercaseNorm{}, nil
	case "Prepend":
		return prependNorm{j.Prepend}, nil
	case "Strip":
		return stripNorm{left: j.StripLeft, right: j.StripRight}, nil
	case "Replace":
		switch {
		case j.Pattern.String != nil:
			return replaceNorm{literal: *j.Pattern.String, content: j.Content}, nil
		case j.Pattern.Regex != nil:
			re, err := compileSplitRegex(*j.Pattern.Regex)
			if err != nil {
				return nil, fmt.Errorf("Replace: %w", err)
			}
			return replaceNorm{re: re, content: j.Content}, nil
		}
		return nil, fmt.Errorf("Replace: no pattern")
	case "Sequence":
		seq := make(sequenceNorm, 0, len(j.Normalizers))
		for i, r := range j.Normalizers {
			n, err := parseNormalizer(r)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			seq = append(seq, n)
		}
		return seq, nil
	}
	return nil, fmt.Errorf("normalizer type %q is not supported", j.Type)
}
