package api

import (
	"bytes"
	"errors"
	"math"
	"slices"
)

// A large body is nearly all one or two fields: a prompt's token ids, or
// a chat's messages. The strict scan (checkBody) walks every byte of them
// anyway, so it takes them out of the body as it goes, and encoding/json
// decodes the rest, a few hundred bytes, with null in their place. Left to
// encoding/json, each would cost a validating pass and a decoding pass on
// top of the scan's. What the scan cannot take as it is (a malformed
// value, an id out of range) it leaves in place, and the decoder reports
// it as before.

// takeFields names the top-level fields a scan takes out of the body:
// tokens is parsed as token ids (none if empty), raw fields are kept as the
// JSON they are.
type takeFields struct {
	tokens string
	raw    []string
}

// taken is what a scan took: the token ids, and every taken field's span
// in the body.
type taken struct {
	ids   []uint32
	spans []span
}

type span struct {
	field      string
	start, end int
}

// scanBody is checkBody, also taking the fields take names (nil: none).
// With a syntax error anywhere it takes nothing.
func scanBody(b []byte, known map[string]bool, exact bool, take *takeFields) (taken, error) {
	sc := scanner{b: b, known: known, exact: exact, take: take}
	sc.ws()
	if sc.i >= len(b) || b[sc.i] != '{' {
		return taken{}, nil
	}
	err := sc.value(0)
	if errors.Is(err, errSyntax) {
		return taken{}, nil
	}
	if err != nil {
		return taken{}, err
	}
	return sc.taken, nil
}

// takeField scans a top-level field's value at s.i, taking it when take
// names the field and the value is well formed.
func (s *scanner) takeField(key string, depth int) error {
	s.ws()
	start := s.i
	switch {
	case key == s.take.tokens && s.take.tokens != "":
		if s.i < len(s.b) && s.b[s.i] == '[' {
			if ids, end, ok := parseTokenArray(s.b, s.i); ok {
				s.taken.ids = ids
				s.taken.spans = append(s.taken.spans, span{key, start, end})
				s.i = end
				return nil
			}
		}
	case slices.Contains(s.take.raw, key):
		s.strict, s.malformed = true, false
		err := s.value(depth)
		s.strict = false
		if err != nil {
			return err
		}
		// Malformed, the value is left in place for the decoder to report.
		if !s.malformed {
			s.taken.spans = append(s.taken.spans, span{key, start, s.i})
		}
		return nil
	}
	return s.value(depth)
}

// literal reports whether b is a JSON number, true, false or null.
func literal(b []byte) bool {
	switch string(b) {
	case "true", "false", "null":
		return true
	}
	i := 0
	digits := func() int {
		n := 0
		for i < len(b) && b[i]-'0' <= 9 {
			i++
			n++
		}
		return n
	}
	if i < len(b) && b[i] == '-' {
		i++
	}
	switch {
	case i < len(b) && b[i] == '0':
		i++
	case digits() == 0:
		return false
	}
	if i < len(b) && b[i] == '.' {
		i++
		if digits() == 0 {
			return false
		}
	}
	if i < len(b) && (b[i] == 'e' || b[i] == 'E') {
		i++
		if i < len(b) && (b[i] == '+' || b[i] == '-') {
			i++
		}
		if digits() == 0 {
			return false
		}
	}
	return i == len(b)
}

// numberRun reports whether run, a stretch of an array the scan skipped as
// numbers, is JSON: numbers separated by commas, ending the array (last)
// or else ending with a comma before the next element.
func numberRun(run []byte, last bool) bool {
	for {
		comma := bytes.IndexByte(run, ',')
		if comma < 0 {
			piece := trimSpace(run)
			if last {
				return literal(piece)
			}
			return len(piece) == 0
		}
		if !literal(trimSpace(run[:comma])) {
			return false
		}
		run = run[comma+1:]
	}
}

// parseTokenArray parses a JSON array of unsigned 32-bit integers at
// b[i] (a '['): JSON's number syntax (no sign, fraction, exponent, or
// leading zero), JSON whitespace, nothing nested. It returns the ids and
// the index just past the array, or ok false for anything else.
func parseTokenArray(b []byte, i int) (ids []uint32, end int, ok bool) {
	close := bytes.IndexByte(b[i:], ']')
	if close < 0 {
		return nil, 0, false
	}
	end = i + close + 1
	a := b[i+1 : end-1]
	ids = idBufs.get(bytes.Count(a, []byte{','}) + 1)
	j := skipWS(a, 0)
	if j == len(a) {
		return ids, end, true // []
	}
	for {
		k := j
		var v uint64
		for k < len(a) && k-j <= 10 && a[k]-'0' <= 9 {
			v = v*10 + uint64(a[k]-'0')
			k++
		}
		if k == j || v > math.MaxUint32 || (a[j] == '0' && k-j > 1) {
			return nil, 0, false
		}
		ids = append(ids, uint32(v))
		k = skipWS(a, k)
		if k == len(a) {
			return ids, end, true
		}
		if a[k] != ',' {
			return nil, 0, false
		}
		j = skipWS(a, k+1)
		if j == len(a) {
			return nil, 0, false // a trailing comma
		}
	}
}

func skipWS(b []byte, i int) int {
	for i < len(b) && (b[i] == ' ' || b[i] == '\t' || b[i] == '\n' || b[i] == '\r') {
		i++
	}
	return i
}

// without returns body with every taken span replaced by null: what the
// decoder is given.
func (t taken) without(body []byte) []byte {
	spans := slices.SortedFunc(slices.Values(t.spans), func(a, b span) int { return a.start - b.start })
	n := len(body)
	for _, sp := range spans {
		n -= sp.end - sp.start - len("null")
	}
	out := make([]byte, 0, n)
	at := 0
	for _, sp := range spans {
		out = append(append(out, body[at:sp.start]...), "null"...)
		at = sp.end
	}
	return append(out, body[at:]...)
}
