package kvevents

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// hashes reads block_hashes: a list of engine hashes, else the event is
// malformed; a list with an unusable hash has a bad hash.
func (st *decoder) hashes() ([]uint64, string, error) {
	return list(st, SkipBadHash, func() (uint64, bool, error) { return st.hash(2) })
}

// list reads a list whose elements are T: plain unsigned integers through
// the fast path (uints), anything else through elem, which reports whether
// the element is usable. A value that is not a list makes the event
// malformed; an unusable element earns it reason.
func list[T uint32 | uint64](st *decoder, reason string, elem func() (T, bool, error)) ([]T, string, error) {
	n, ok, err := st.listLen()
	if !ok {
		return nil, SkipMalformed, err
	}
	if err != nil {
		return nil, "", err
	}
	out := make([]T, n)
	bad := ""
	for i := 0; ; i++ {
		// The fast path stops at anything else; msgpack reads that one.
		if i += uints(st, out[i:]); i == n {
			return out, bad, nil
		}
		v, ok, err := elem()
		if err != nil {
			return nil, "", err
		}
		if !ok {
			bad = reason
		}
		out[i] = v
	}
}

// listLen opens a field's value as a list and returns its length. ok is
// false for any other value, which is stepped over (err is then walk's); a
// length the rest of the payload cannot hold is an error, so that a forged
// one never sizes an allocation.
func (st *decoder) listLen() (n int, ok bool, err error) {
	c, err := st.d.PeekCode()
	if err != nil {
		return 0, true, err
	}
	if !isArray(c) {
		return 0, false, walk(st.d, 1)
	}
	if n, err = st.d.DecodeArrayLen(); err != nil {
		return 0, true, err
	}
	return n, true, st.fits(n)
}

// hash reads one engine hash at depth: integers of any width (negative
// ones reinterpreted as their two's complement), or bytes/str digests of
// which the last 8 bytes are read big-endian, as vLLM does for its int
// form. ok is false for anything else, which is stepped over.
func (st *decoder) hash(depth int) (h uint64, ok bool, err error) {
	d := st.d
	c, err := d.PeekCode()
	if err != nil {
		return 0, false, err
	}
	switch {
	case isInt(c):
		n, err := d.DecodeInt64()
		return uint64(n), err == nil, err
	case c == msgpcode.Uint64:
		u, err := d.DecodeUint64()
		return u, err == nil, err
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		b, err := st.strBytes()
		if err != nil {
			return 0, false, err
		}
		h, ok := digestTail(b)
		return h, ok, nil
	}
	return 0, false, walk(d, depth)
}

// tokens reads token_ids: a list of ids in uint32 range, else the event is
// malformed.
func (st *decoder) tokens() ([]uint32, string, error) {
	return list(st, SkipMalformed, func() (uint32, bool, error) {
		t, ok, err := st.int(2)
		if !ok || t < 0 || t > math.MaxUint32 {
			return 0, false, err
		}
		return uint32(t), true, err
	})
}

// uints reads into out, in place, the values ahead that are unsigned
// integers that fit a T, in any of msgpack's unsigned forms (fixint, uint8
// to uint64): the forms of nearly every token id and engine hash. It
// returns how many it read, stopping at any other value, or a truncated
// one, which the caller then reads through msgpack. Going through msgpack's
// byte-at-a-time reader cost several times more than the rest of decoding
// together.
func uints[T uint32 | uint64](st *decoder, out []T) int {
	max := uint64(^T(0))
	b, p := st.buf, st.offset()
	i := 0
	for ; i < len(out) && p < len(b); i++ {
		switch c := b[p]; {
		case c <= msgpcode.PosFixedNumHigh:
			out[i], p = T(c), p+1
		case c == msgpcode.Uint8 && p+2 <= len(b):
			out[i], p = T(b[p+1]), p+2
		case c == msgpcode.Uint16 && p+3 <= len(b):
			out[i], p = T(binary.BigEndian.Uint16(b[p+1:])), p+3
		case c == msgpcode.Uint32 && p+5 <= len(b):
			out[i], p = T(binary.BigEndian.Uint32(b[p+1:])), p+5
		case c == msgpcode.Uint64 && p+9 <= len(b) && binary.BigEndian.Uint64(b[p+1:]) <= max:
			out[i], p = T(binary.BigEndian.Uint64(b[p+1:])), p+9
		default:
			st.seek(p)
			return i
		}
	}
	st.seek(p)
	return i
}

// int reads a count or id at depth: any integer up to MaxInt64, or an
// integral float below 2^53. ok is false for anything else, which is
// stepped over.
func (st *decoder) int(depth int) (n int64, ok bool, err error) {
	d := st.d
	c, err := d.PeekCode()
	if err != nil {
		return 0, false, err
	}
	switch {
	case isInt(c):
		n, err := d.DecodeInt64()
		return n, err == nil, err
	case c == msgpcode.Uint64:
		u, err := d.DecodeUint64()
		return int64(u), err == nil && u <= math.MaxInt64, err
	case c == msgpcode.Float || c == msgpcode.Double:
		x, err := d.DecodeFloat64()
		if err != nil || x != math.Trunc(x) || math.Abs(x) >= 1<<53 {
			return 0, false, err
		}
		return int64(x), true, nil
	}
	return 0, false, walk(d, depth)
}

// optString reads a str or bin field; ok is false for anything else. The
// values vLLM repeats in every event are not copied.
func (st *decoder) optString() (s string, ok bool, err error) {
	c, err := st.d.PeekCode()
	if err != nil {
		return "", false, err
	}
	if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
		return "", false, walk(st.d, 1)
	}
	b, err := st.strBytes()
	switch string(b) {
	case "GPU":
		return "GPU", true, err
	case "CPU":
		return "CPU", true, err
	case "full_attention":
		return "full_attention", true, err
	}
	return string(b), true, err
}

// extraKeys reads extra_keys: per block nil, a list of items, or a bare
// item where a list belongs (kept as one item rather than losing what it
// says about the block).
func (st *decoder) extraKeys() ([][]ExtraKey, bool, error) {
	d := st.d
	n, ok, err := st.listLen()
	if err != nil || !ok {
		return nil, false, err
	}
	out := make([][]ExtraKey, n)
	for i := range out {
		c, err := d.PeekCode()
		if err != nil {
			return nil, false, err
		}
		switch {
		case c == msgpcode.Nil:
			err = d.DecodeNil()
		case isArray(c):
			var m int
			if m, err = d.DecodeArrayLen(); err != nil {
				return nil, false, err
			}
			if err := st.fits(m); err != nil {
				return nil, false, err
			}
			keys := make([]ExtraKey, m)
			for j := range keys {
				if keys[j], err = st.extraKey(3); err != nil {
					return nil, false, err
				}
			}
			out[i] = keys
		default:
			var k ExtraKey
			k, err = st.extraKey(2)
			out[i] = []ExtraKey{k}
		}
		if err != nil {
			return nil, false, err
		}
	}
	return out, true, nil
}

// extraKey reads one extra_keys item at depth; the plain kinds directly,
// anything else through the generic walk, rendered by extraKeyOf.
func (st *decoder) extraKey(depth int) (ExtraKey, error) {
	d := st.d
	c, err := d.PeekCode()
	if err != nil {
		return ExtraKey{}, err
	}
	switch {
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		b, err := st.strBytes()
		kind := ExtraString
		if msgpcode.IsBin(c) {
			kind = ExtraBytes
		}
		return ExtraKey{Kind: kind, Str: string(b)}, err
	case isInt(c):
		n, err := d.DecodeInt64()
		return ExtraKey{Kind: ExtraInt, Int: n}, err
	}
	v, err := decodeValue(d, depth)
	if err != nil {
		return ExtraKey{}, err
	}
	return extraKeyOf(v), nil
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

// isInt reports the integer codes that fit an int64 whatever their value
// (uint64 does not).
func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64 ||
		c == msgpcode.Uint8 || c == msgpcode.Uint16 || c == msgpcode.Uint32
}

// walk steps over one value at depth, failing with errTooDeep if it nests
// deeper than maxDepth: what decodeValue would refuse makes an event
// malformed even where its content is ignored.
func walk(d *msgpack.Decoder, depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	n := 0
	switch {
	case isArray(c):
		if n, err = d.DecodeArrayLen(); err != nil {
			return err
		}
	case isMap(c):
		if n, err = d.DecodeMapLen(); err != nil {
			return err
		}
		n *= 2
	default:
		return d.Skip()
	}
	for i := 0; i < n; i++ {
		if err := walk(d, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// decodeValue reads any msgpack value into nil, bool, int64, uint64 (only
// above MaxInt64), float64, string, []byte, []any or map[string]any (entries
// with non-string keys are dropped). It reads what the typed path has no
// use for: the batch's ts and rank, a map batch's keys, unusual extra keys.
func decodeValue(d *msgpack.Decoder, depth int) (any, error) {
	if depth > maxDepth {
		return nil, errTooDeep
	}
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case c == msgpcode.Nil:
		return nil, d.DecodeNil()
	case c == msgpcode.True || c == msgpcode.False:
		return d.DecodeBool()
	case isInt(c):
		return d.DecodeInt64()
	case c == msgpcode.Uint64:
		u, err := d.DecodeUint64()
		if err != nil {
			return nil, err
		}
		if u <= math.MaxInt64 {
			return int64(u), nil
		}
		return u, nil
	case c == msgpcode.Float || c == msgpcode.Double:
		return d.DecodeFloat64()
	case msgpcode.IsString(c):
		return d.DecodeString()
	case msgpcode.IsBin(c):
		return d.DecodeBytes()
	case isArray(c):
		n, err := d.DecodeArrayLen()
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, 0, min(n, 1024))
		for i := 0; i < n; i++ {
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case isMap(c):
		n, err := d.DecodeMapLen()
		if err != nil || n < 0 {
			return nil, err
		}
		out := make(map[string]any, min(n, 64))
		for i := 0; i < n; i++ {
			k, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			if ks, ok := k.(string); ok {
				out[ks] = v
			}
		}
		return out, nil
	default:
		// Extensions and anything newer: skip over it, keep it as opaque.
		if err := d.Skip(); err != nil {
			return nil, err
		}
		return opaque{}, nil
	}
}

// opaque stands for a value of a kind this decoder does not interpret.
type opaque struct{}

func digestTail(b []byte) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:]), true
	}
	var buf [8]byte
	copy(buf[8-len(b):], b)
	return binary.BigEndian.Uint64(buf[:]), true
}

func extraKeyOf(v any) ExtraKey {
	switch x := v.(type) {
	case string:
		return ExtraKey{Kind: ExtraString, Str: x}
	case []byte:
		return ExtraKey{Kind: ExtraBytes, Str: string(x)}
	case int64:
		return ExtraKey{Kind: ExtraInt, Int: x}
	case uint64:
		return ExtraKey{Kind: ExtraOther, Str: strconv.FormatUint(x, 10)}
	case []any:
		if len(x) == 2 {
			off, ok := asInt(x[1])
			switch id := x[0].(type) {
			case string:
				if ok {
					return ExtraKey{Kind: ExtraPair, Str: id, Int: off}
				}
			case []byte:
				if ok {
					return ExtraKey{Kind: ExtraPair, Str: string(id), Int: off}
				}
			}
		}
	}
	return ExtraKey{Kind: ExtraOther, Str: fmt.Sprint(v)}
}

func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case uint64:
		return 0, false // above MaxInt64: not a count
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x), true
		}
	}
	return 0, false
}

func asFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	}
	return 0, false
}
