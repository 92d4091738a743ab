package template

import (
	"bytes"
	"encoding/json"
	"encoding/json/jsontext"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"unicode/utf8"

	"github.com/ardanlabs/jinja"
)

// The request is decoded into a small tree of its own rather than into
// map[string]any, because vLLM hands the template Python values straight
// from json.loads: objects keep their key order (tojson prints them in that
// order) and numbers keep their int/float distinction (47.0 prints "47.0",
// 47 prints "47"). A tree node is one of: nil (JSON null), bool,
// json.Number, string, []any, *object.

// object is a JSON object with its keys in the order the client sent them.
// A repeated key keeps its first position and its last value, as Python's
// dict does when json.loads meets duplicates.
type object struct {
	keys []string
	vals map[string]any
}

func newObject() *object { return &object{vals: map[string]any{}} }

func (o *object) get(k string) (any, bool) {
	v, ok := o.vals[k]
	return v, ok
}

func (o *object) set(k string, v any) {
	if _, ok := o.vals[k]; !ok {
		o.keys = append(o.keys, k)
	}
	o.vals[k] = v
}

func (o *object) del(k string) {
	if _, ok := o.vals[k]; !ok {
		return
	}
	delete(o.vals, k)
	for i, key := range o.keys {
		if key == k {
			o.keys = append(o.keys[:i:i], o.keys[i+1:]...)
			break
		}
	}
}

// decodeJSON parses one JSON document into the ordered tree. Trailing data
// after the document is an error, as it is for json.loads. Like json.loads
// it takes a repeated key (the last value wins) and, as encoding/json
// does, turns invalid UTF-8 into U+FFFD. It reads tokens with jsontext
// directly: a chat's messages are most of a large request, and
// encoding/json's Decoder.Token costs half again as much per token.
func decodeJSON(raw []byte) (any, error) {
	dec := jsontext.NewDecoder(bytes.NewReader(raw), jsontext.AllowDuplicateNames(true), jsontext.AllowInvalidUTF8(true))
	v, err := decodeValue(dec)
	if err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if _, err := dec.ReadToken(); !errors.Is(err, io.EOF) {
		return nil, errors.New("invalid JSON: data after the value")
	}
	return v, nil
}

func decodeValue(dec *jsontext.Decoder) (any, error) {
	if dec.PeekKind() == '"' {
		// Message contents are most of a chat: read the raw string and
		// copy it out once when it holds no escape (the decoder has
		// checked it), instead of unquoting it in a second pass.
		raw, err := dec.ReadValue()
		if err != nil {
			return nil, err
		}
		if bytes.IndexByte(raw, '\\') < 0 && utf8.Valid(raw) {
			return string(raw[1 : len(raw)-1]), nil
		}
		// The decoder has checked the string, so the only error left is
		// invalid UTF-8, which AppendUnquote has already replaced with
		// U+FFFD, as ReadToken would.
		s, _ := jsontext.AppendUnquote(nil, raw)
		return string(s), nil
	}
	tok, err := dec.ReadToken()
	if err != nil {
		return nil, err
	}
	switch tok.Kind() {
	case '{':
		obj := newObject()
		for dec.PeekKind() != '}' {
			kt, err := dec.ReadToken()
			if err != nil {
				return nil, err
			}
			key := kt.String() // before the next read voids the token
			val, err := decodeValue(dec)
			if err != nil {
				return nil, err
			}
			obj.set(key, val)
		}
		if _, err := dec.ReadToken(); err != nil {
			return nil, err
		}
		return obj, nil
	case '[':
		list := []any{}
		for dec.PeekKind() != ']' {
			val, err := decodeValue(dec)
			if err != nil {
				return nil, err
			}
			list = append(list, val)
		}
		if _, err := dec.ReadToken(); err != nil {
			return nil, err
		}
		return list, nil
	case '"':
		return tok.String(), nil
	case '0':
		return json.Number(tok.String()), nil
	case 't':
		return true, nil
	case 'f':
		return false, nil
	case 'n':
		return nil, nil
	}
	return nil, fmt.Errorf("unexpected %v", tok)
}

// deepCopy copies containers so that a render may edit its conversation
// (continue_final_message, the multimodal sentinel) without touching the
// caller's decoded request.
func deepCopy(v any) any {
	switch t := v.(type) {
	case []any:
		out := make([]any, len(t))
		for i, item := range t {
			out[i] = deepCopy(item)
		}
		return out
	case *object:
		out := &object{keys: append([]string(nil), t.keys...), vals: make(map[string]any, len(t.vals))}
		for k, item := range t.vals {
			out.vals[k] = deepCopy(item)
		}
		return out
	}
	return v
}

// toValue converts a tree node into the engine's value, as Python would
// see it after json.loads: integers without a fraction or exponent are
// ints, everything else numeric is a float.
func toValue(v any) (jinja.Value, error) {
	switch t := v.(type) {
	case nil:
		return jinja.None(), nil
	case bool:
		return jinja.NewBool(t), nil
	case string:
		return jinja.NewString(t), nil
	case json.Number:
		return numberValue(string(t))
	case []any:
		items := make([]jinja.Value, len(t))
		for i, item := range t {
			val, err := toValue(item)
			if err != nil {
				return jinja.Value{}, err
			}
			items[i] = val
		}
		return jinja.NewList(items), nil
	case *object:
		d := jinja.NewDict()
		dict := d.AsDict()
		for _, k := range t.keys {
			val, err := toValue(t.vals[k])
			if err != nil {
				return jinja.Value{}, err
			}
			dict.Set(k, val)
		}
		return d, nil
	case jinja.Value:
		return t, nil
	}
	return jinja.Value{}, fmt.Errorf("unsupported value %T", v)
}

// numberValue mirrors json.loads: an integer literal is an int (Python's
// are unbounded; the engine's are int64, so larger ones are refused rather
// than silently rounded), any other literal a float, overflowing to inf.
func numberValue(s string) (jinja.Value, error) {
	if !strings.ContainsAny(s, ".eE") {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return jinja.Value{}, fmt.Errorf("integer %s does not fit in 64 bits", s)
		}
		return jinja.NewInt(n), nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil && !math.IsInf(f, 0) {
		return jinja.Value{}, fmt.Errorf("invalid number %s", s)
	}
	return jinja.NewFloat(f), nil
}
