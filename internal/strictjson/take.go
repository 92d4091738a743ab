package strictjson

import (
	"bytes"
	"math"
	"slices"
)

// takeField scans a top-level field's value at s.i, taking it when take
// names the field and the value is well formed.
func (s *scanner) takeField(key string, depth int) error {
	s.ws()
	start := s.i
	switch {
	case key == s.take.Tokens && s.take.Tokens != "":
		if s.i < len(s.b) && s.b[s.i] == '[' {
			if ids, end, ok := parseTokenArray(s.b, s.i); ok {
				s.taken.IDs = ids
				s.taken.Spans = append(s.taken.Spans, Span{key, start, end})
				s.i = end
				return nil
			}
		}
	case slices.Contains(s.take.Raw, key):
		s.strict, s.malformed = true, false
		err := s.value(depth)
		s.strict = false
		if err != nil {
			return err
		}
		// Malformed, the value is left in place for the decoder to report.
		if !s.malformed {
			s.taken.Spans = append(s.taken.Spans, Span{key, start, s.i})
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
			piece := TrimSpace(run)
			if last {
				return literal(piece)
			}
			return len(piece) == 0
		}
		if !literal(TrimSpace(run[:comma])) {
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
	ids = IDs.Get(bytes.Count(a, []byte{','}) + 1)
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
