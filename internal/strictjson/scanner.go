package strictjson

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/kvroute/kvroute"
)

// MaxDepth bounds how deeply a body's JSON may nest. Chat messages, tool
// schemas and template options nest a few levels; a body nested thousands
// deep only costs the decoder stack.
const MaxDepth = 128

var errSyntax = errors.New("syntax")

type scanner struct {
	b     []byte
	i     int
	known map[string]bool
	exact bool
	// path is the field being scanned, for error messages: keys and
	// array indexes from the top.
	path []string
	// take says which top-level fields the scan takes out of the body
	// (nil: none); taken is what it took.
	take  *Take
	taken Taken
	// strict is set while a value to be taken is scanned: the scan then
	// also notes (in malformed) what it lets through for the decoder to
	// report, a bad number, literal or escape, since the decoder will not
	// see the value. It changes no path the scan takes, so it changes no
	// error.
	strict, malformed bool
}

func (s *scanner) field() string {
	if len(s.path) == 0 {
		return ""
	}
	var b strings.Builder
	for i, p := range s.path {
		if i > 0 && (p == "" || p[0] != '[') {
			b.WriteByte('.')
		}
		b.WriteString(p)
	}
	return b.String()
}

func (s *scanner) fail(msg string) error {
	return &kvroute.FieldError{Field: s.field(), Msg: msg}
}

func (s *scanner) ws() { s.i = skipWS(s.b, s.i) }

func (s *scanner) value(depth int) error {
	s.ws()
	if s.i >= len(s.b) {
		return errSyntax
	}
	switch c := s.b[s.i]; {
	case (c == '{' || c == '[') && depth >= MaxDepth:
		// Named by its top-level field: the full path is as deep.
		return &kvroute.FieldError{Field: s.path[0], Msg: fmt.Sprintf("nests deeper than %d levels", MaxDepth)}
	case c == '{':
		return s.object(depth + 1)
	case c == '[':
		return s.array(depth + 1)
	case c == '"':
		_, err := s.str(false)
		return err
	default:
		// Numbers and literals: their syntax is the decoder's to check.
		start := s.i
		for s.i < len(s.b) {
			switch s.b[s.i] {
			case ',', '}', ']', ' ', '\t', '\n', '\r':
				s.noteLiteral(start)
				return nil
			}
			s.i++
		}
		s.noteLiteral(start)
		return nil
	}
}

func (s *scanner) noteLiteral(start int) {
	if s.strict && !literal(s.b[start:s.i]) {
		s.malformed = true
	}
}

func (s *scanner) object(depth int) error {
	s.i++ // {
	var seen map[string]bool
	var few []string
	for n := 0; ; n++ {
		s.ws()
		if s.i >= len(s.b) {
			return errSyntax
		}
		if s.b[s.i] == '}' && n == 0 {
			s.i++
			return nil
		}
		if s.b[s.i] != '"' {
			return errSyntax
		}
		key, err := s.str(true)
		if err != nil {
			return err
		}
		s.path = append(s.path, key)
		if dup := hasKey(few, seen, key); dup {
			return s.fail("is given more than once")
		}
		if len(few) < 8 {
			few = append(few, key)
		} else {
			if seen == nil {
				seen = map[string]bool{}
			}
			seen[key] = true
		}
		if depth == 1 && s.known != nil && !s.known[key] {
			if s.exact {
				return s.fail("is not a known field" + caseHint(s.known, key))
			} else if hint := caseHint(s.known, key); hint != "" {
				return s.fail("is not a known field" + hint)
			}
		}
		s.ws()
		if s.i >= len(s.b) || s.b[s.i] != ':' {
			return errSyntax
		}
		s.i++
		if depth == 1 && s.take != nil {
			if err := s.takeField(key, depth); err != nil {
				return err
			}
		} else if err := s.value(depth); err != nil {
			return err
		}
		s.path = s.path[:len(s.path)-1]
		if end, err := s.sep('}'); err != nil || end {
			return err
		}
	}
}

func hasKey(few []string, seen map[string]bool, key string) bool {
	for _, k := range few {
		if k == key {
			return true
		}
	}
	return seen[key]
}

// caseHint names the known field key differs from only in case.
func caseHint(known map[string]bool, key string) string {
	for k := range known {
		if strings.EqualFold(k, key) {
			return " (field names are case-sensitive: " + k + ")"
		}
	}
	return ""
}

func (s *scanner) array(depth int) error {
	s.i++ // [
	for n := 0; ; n++ {
		s.ws()
		if s.i >= len(s.b) {
			return errSyntax
		}
		if s.b[s.i] == ']' && n == 0 {
			s.i++
			return nil
		}
		// Arrays of token ids run to a million elements: skip a run of
		// plain numbers in one tight loop (their syntax is the decoder's
		// to check, as for any number).
		if c := s.b[s.i]; c >= '0' && c <= '9' || c == '-' {
			j := s.i
			for j < len(s.b) {
				c := s.b[j]
				if c == ',' {
					n++ // the index of an element that follows, for the path
				} else if !(c >= '0' && c <= '9' || c == ' ' || c == '-' || c == '.' || c == 'e' || c == 'E' || c == '+' || c == '\n' || c == '\t' || c == '\r') {
					break
				}
				j++
			}
			if s.strict && !numberRun(s.b[s.i:j], j < len(s.b) && s.b[j] == ']') {
				s.malformed = true
			}
			s.i = j
			if s.i >= len(s.b) {
				return errSyntax
			}
			if s.b[s.i] == ']' {
				s.i++
				return nil
			}
			// Something else follows (a string or a nested value after
			// the numbers): go on element by element from here.
			if c := s.b[s.i]; c != '{' && c != '[' && c != '"' {
				return errSyntax
			}
		}
		// Other elements: scanned one by one, numbers without touching
		// the path.
		if c := s.b[s.i]; c == '{' || c == '[' || c == '"' {
			s.path = append(s.path, "["+strconv.Itoa(n)+"]")
			if err := s.value(depth); err != nil {
				return err
			}
			s.path = s.path[:len(s.path)-1]
		} else if err := s.value(depth); err != nil {
			return err
		}
		if end, err := s.sep(']'); err != nil || end {
			return err
		}
	}
}

// sep moves past what follows a member or an element: a comma (more
// follow) or close (the object or array ends, end is true).
func (s *scanner) sep(close byte) (end bool, err error) {
	s.ws()
	if s.i >= len(s.b) {
		return false, errSyntax
	}
	switch s.b[s.i] {
	case ',':
		s.i++
		return false, nil
	case close:
		s.i++
		return true, nil
	}
	return false, errSyntax
}

// str scans a string at s.i, checking its UTF-8 and escapes. A key is
// returned unescaped; other strings are only checked.
func (s *scanner) str(key bool) (string, error) {
	s.i++ // "
	start := s.i
	escaped := false
	for s.i < len(s.b) {
		s.i = plainRun(s.b, s.i)
		if s.i >= len(s.b) {
			break
		}
		c := s.b[s.i]
		switch {
		case c == '"':
			raw := s.b[start:s.i]
			s.i++
			if !key {
				return "", nil
			}
			if !escaped {
				return string(raw), nil
			}
			k, err := strconv.Unquote(`"` + string(raw) + `"`)
			if err != nil {
				// JSON escapes strconv does not know (\/): decode the
				// way the decoder will.
				k = strings.ReplaceAll(string(raw), `\/`, `/`)
				if k2, err := strconv.Unquote(`"` + k + `"`); err == nil {
					k = k2
				}
			}
			return k, nil
		case c == '\\':
			escaped = true
			if s.i+1 >= len(s.b) {
				return "", errSyntax
			}
			if c := s.b[s.i+1]; c != 'u' {
				if s.strict && !strings.ContainsRune(`"\/bfnrt`, rune(c)) {
					s.malformed = true
				}
				s.i += 2
				continue
			}
			r, ok := hex4(s.b, s.i+2)
			if !ok {
				return "", errSyntax
			}
			s.i += 6
			switch {
			case r >= 0xD800 && r < 0xDC00:
				// A high surrogate must be followed by a low one.
				if s.i+1 < len(s.b) && s.b[s.i] == '\\' && s.b[s.i+1] == 'u' {
					if r2, ok := hex4(s.b, s.i+2); ok && r2 >= 0xDC00 && r2 < 0xE000 {
						s.i += 6
						continue
					}
				}
				return "", s.badText(key, start)
			case r >= 0xDC00 && r < 0xE000:
				return "", s.badText(key, start)
			}
		case c < 0x20:
			return "", errSyntax
		case c < utf8.RuneSelf:
			s.i++
		default:
			r, size := utf8.DecodeRune(s.b[s.i:])
			if r == utf8.RuneError && size <= 1 {
				return "", s.badText(key, start)
			}
			s.i += size
		}
	}
	return "", errSyntax
}

// plainRun returns the index of the first byte at or after i, in steps
// of eight, that may not be plain string text: a quote, a backslash, a
// control character or a byte of a multi-byte UTF-8 sequence. A chat's
// messages are hundreds of kilobytes of such text; testing eight bytes at
// once makes the scan several times quicker. The caller examines bytes
// from the returned index one at a time.
func plainRun(b []byte, i int) int {
	const (
		ones  = 0x0101010101010101
		highs = 0x8080808080808080
	)
	// zero has its high bit set in every byte of x that is zero; below,
	// in every byte under 0x20 (exact for bytes under 0x80, checked first).
	zero := func(x uint64) uint64 { return (x - ones) &^ x & highs }
	below := func(x uint64) uint64 { return (x - 0x20*ones) &^ x & highs }
	for ; i+8 <= len(b); i += 8 {
		x := binary.LittleEndian.Uint64(b[i:])
		if x&highs != 0 || below(x) != 0 || zero(x^('"'*ones)) != 0 || zero(x^('\\'*ones)) != 0 {
			return i
		}
	}
	return i
}

func (s *scanner) badText(key bool, start int) error {
	if key {
		// The key is named as far as it is readable.
		name := strings.ToValidUTF8(string(s.b[start:s.i]), "\uFFFD") + "\uFFFD"
		s.path = append(s.path, name)
		return s.fail("is a key that is not valid UTF-8")
	}
	return s.fail("is not valid UTF-8 (or holds a lone surrogate escape)")
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[i:i+4]), 16, 32)
	return rune(v), err == nil
}
