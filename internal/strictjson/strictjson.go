// Package strictjson is the strict scan of a JSON request body: what
// encoding/json lets through silently (duplicate keys, case-variant field
// names, invalid UTF-8, lone surrogates, deep nesting) is refused with an
// error naming the field at fault, and the body's large fields (a prompt's
// token ids, a chat's messages) are taken out of it in the same pass, so
// that encoding/json decodes only the few hundred bytes left.
//
// It has no HTTP in it: api reads the body and maps the errors to
// statuses. It is internal, not a top-level package beside scoring and
// prompt, because its API is shaped by kvroute's two request bodies (its
// errors are kvroute.FieldError, it parses token ids) rather than offered
// as a general JSON library; only api uses it.
package strictjson

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"sync"
)

// Check scans a JSON body for what encoding/json lets through silently:
// an object key given twice (a client and a replica may read different
// values), a top-level key that matches a field only when case is ignored
// (encoding/json matches "MODEL" to model; vLLM does not), strings that
// are not valid UTF-8 or hold a lone surrogate escape (encoding/json
// replaces them with U+FFFD, so kvroute would key other text than the
// engine computes), and nesting deeper than MaxDepth. known is the body's
// set of fields (Fields); with exact, a top-level key not in it is an
// error too (the strict endpoints), else only its case variants are (the
// proxy forwards other fields to the replica). Malformed JSON is left for
// the decoder to report, with its offset. Errors are *kvroute.FieldError.
func Check(b []byte, known map[string]bool, exact bool) error {
	_, err := Scan(b, known, exact, nil)
	return err
}

// A large body is nearly all one or two fields: a prompt's token ids, or
// a chat's messages. The strict scan walks every byte of them anyway, so
// it takes them out of the body as it goes, and encoding/json decodes the
// rest, a few hundred bytes, with null in their place (Taken.Without).
// Left to encoding/json, each would cost a validating pass and a decoding
// pass on top of the scan's. What the scan cannot take as it is (a
// malformed value, an id out of range) it leaves in place, and the
// decoder reports it as before.

// Take names the top-level fields a scan takes out of the body: Tokens is
// parsed as token ids (none if empty), Raw fields are kept as the JSON
// they are.
type Take struct {
	Tokens string
	Raw    []string
}

// Taken is what a scan took: the token ids (from IDs, the pool), and
// every taken field's span in the body.
type Taken struct {
	IDs   []uint32
	Spans []Span
}

// Span is where a taken field's value lies in the body: body[Start:End].
type Span struct {
	Field      string
	Start, End int
}

// Scan is Check, also taking the fields take names (nil: none). With a
// syntax error anywhere it takes nothing.
func Scan(b []byte, known map[string]bool, exact bool, take *Take) (Taken, error) {
	sc := scanner{b: b, known: known, exact: exact, take: take}
	sc.ws()
	if sc.i >= len(b) || b[sc.i] != '{' {
		return Taken{}, nil
	}
	err := sc.value(0)
	if errors.Is(err, errSyntax) {
		return Taken{}, nil
	}
	if err != nil {
		return Taken{}, err
	}
	return sc.taken, nil
}

// Without returns body with every taken span replaced by null: what the
// decoder is given.
func (t Taken) Without(body []byte) []byte {
	spans := slices.SortedFunc(slices.Values(t.Spans), func(a, b Span) int { return a.Start - b.Start })
	n := len(body)
	for _, sp := range spans {
		n -= sp.End - sp.Start - len("null")
	}
	out := make([]byte, 0, n)
	at := 0
	for _, sp := range spans {
		out = append(append(out, body[at:sp.Start]...), "null"...)
		at = sp.End
	}
	return append(out, body[at:]...)
}

// TrimSpace is b without leading and trailing JSON whitespace (space, tab,
// newline, carriage return): narrower than bytes.TrimSpace, which would
// also take a form feed that JSON refuses.
func TrimSpace(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t' || b[0] == '\n' || b[0] == '\r') {
		b = b[1:]
	}
	for len(b) > 0 && (b[len(b)-1] == ' ' || b[len(b)-1] == '\t' || b[len(b)-1] == '\n' || b[len(b)-1] == '\r') {
		b = b[:len(b)-1]
	}
	return b
}

// Fields is the set of JSON field names of a struct type (embedded
// structs' included), computed once per type.
func Fields(t reflect.Type) map[string]bool {
	if m, ok := fieldCache.Load(t); ok {
		return m.(map[string]bool)
	}
	m := map[string]bool{}
	var walk func(reflect.Type)
	walk = func(t reflect.Type) {
		for i := range t.NumField() {
			f := t.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			switch {
			case name == "-":
			case f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct:
				walk(f.Type)
			case !f.IsExported():
			case name == "":
				m[f.Name] = true
			default:
				m[name] = true
			}
		}
	}
	walk(t)
	fieldCache.Store(t, m)
	return m
}

var fieldCache sync.Map
