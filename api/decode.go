package api

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"mime"
	"net/http"
	"reflect"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/strictjson"
)

// readBody reads the whole body, at most MaxBodyBytes of it. The proxy needs
// the bytes twice (to route on, then to forward), so it reads them once.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	if err := checkJSON(r); err != nil {
		return nil, err
	}
	body := http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes)
	// A body of token ids runs to megabytes: read it into one buffer of
	// its declared size instead of growing one by doubling (each doubling
	// a copy, and all of it garbage). The declared size is only a hint,
	// bounded by MaxBodyBytes; a body longer or shorter than it reads
	// correctly either way. The extra MinRead bytes let ReadFrom see the
	// end of the body without growing the buffer.
	if n := r.ContentLength; n > 0 && n <= s.cfg.MaxBodyBytes {
		buf := bytes.NewBuffer(bodyBufs.Get(int(n) + bytes.MinRead))
		if _, err := buf.ReadFrom(body); err != nil {
			return nil, err
		}
		return buf.Bytes(), nil
	}
	return io.ReadAll(body)
}

// decodeStrict decodes a JSON object body into v, a pointer to a struct,
// rejecting unknown fields (a misspelt option must not be silently
// ignored) and keys that match a field only case-insensitively, duplicate
// keys, invalid UTF-8, trailing data and bodies over MaxBodyBytes.
func (s *Server) decodeStrict(w http.ResponseWriter, r *http.Request, v any) error {
	body, err := s.readBody(w, r)
	if err != nil {
		return err
	}
	return decodeBody(body, v)
}

// bodyBufs recycles the buffers bodies are read into (readBody); the
// /v1/route handler gives one back with its ids (strictjson.IDs).
var bodyBufs strictjson.Pool[byte]

// takingBody is a body type whose large top-level fields decodeBody takes
// in its strict scan instead of handing them to encoding/json (see
// strictjson.Take): it names them, and receives what was taken.
type takingBody interface {
	takeFields() *strictjson.Take
	setTaken(body []byte, t strictjson.Taken)
}

var routeTake = &strictjson.Take{Tokens: tokenField, Raw: []string{"messages", "tools", "documents", "chat_template_kwargs"}}

func (b *RouteRequest) takeFields() *strictjson.Take { return routeTake }

func (b *RouteRequest) setTaken(body []byte, t strictjson.Taken) {
	for _, sp := range t.Spans {
		raw := json.RawMessage(body[sp.Start:sp.End])
		if sp.Field == tokenField {
			b.TokenIDs = t.IDs
		} else {
			b.chatFields.set(sp.Field, raw)
		}
	}
}

var proxyTake = &strictjson.Take{Tokens: tokenField, Raw: []string{"prompt", "prompt_embeds", "messages", "tools", "documents", "chat_template_kwargs"}}

func (o *openAIRequest) takeFields() *strictjson.Take { return proxyTake }

func (o *openAIRequest) setTaken(body []byte, t strictjson.Taken) {
	for _, sp := range t.Spans {
		raw := json.RawMessage(body[sp.Start:sp.End])
		switch sp.Field {
		case tokenField:
			o.TokenIDs = t.IDs
		case "prompt":
			o.Prompt = raw
		case "prompt_embeds":
			o.PromptEmbeds = raw
		default:
			o.chatFields.set(sp.Field, raw)
		}
	}
}

// set stores a taken chat field.
func (c *chatFields) set(field string, raw json.RawMessage) {
	switch field {
	case "messages":
		c.Messages = raw
	case "tools":
		c.Tools = raw
	case "documents":
		c.Documents = raw
	case "chat_template_kwargs":
		c.ChatTemplateKwargs = raw
	}
}

// DecodeRouteRequest decodes a POST /v1/route body exactly as the handler
// does (the same checks, the same errors): for callers that hold the bytes,
// and for measuring what decoding costs.
func DecodeRouteRequest(body []byte) (RouteRequest, error) {
	var req RouteRequest
	err := decodeBody(body, &req)
	return req, err
}

// decodeBody is decodeStrict's work on a body already read.
func decodeBody(body []byte, v any) error {
	return decodeWith(body, v, strictjson.Fields(reflect.TypeOf(v).Elem()), true, decodeJSON)
}

// decodeWith checks body as strictjson.Check does (known and exact as there) and
// decodes it into v with decode, taking v's large fields in the scan when
// v is a takingBody.
func decodeWith(body []byte, v any, known map[string]bool, exact bool, decode func([]byte, any) error) error {
	tb, _ := v.(takingBody)
	var take *strictjson.Take
	if tb != nil {
		take = tb.takeFields()
	}
	t, err := strictjson.Scan(body, known, exact, take)
	if err != nil {
		return err
	}
	if len(t.Spans) == 0 {
		return decode(body, v)
	}
	if err := decode(t.Without(body), v); err != nil {
		// Reported against the body as sent (an offset into what the
		// decoder was given would point elsewhere).
		return decode(body, v)
	}
	tb.setTaken(body, t)
	return nil
}

// unmarshalJSON is the proxy's lenient decode: unknown fields are the
// replica's business.
func unmarshalJSON(body []byte, v any) error {
	if err := json.Unmarshal(body, v); err != nil {
		return jsonError(err)
	}
	return nil
}

// decodeJSON decodes body, one JSON object and nothing after it, into v,
// rejecting unknown fields.
func decodeJSON(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return fmt.Errorf("%w: unexpected data after the JSON object", kvroute.ErrInvalidInput)
	}
	return nil
}

// checkJSON accepts a JSON content type, none at all, or the form type
// that `curl -d` sends unless told otherwise: the body is parsed as JSON
// either way, and the quick-start examples must work as typed. Anything
// else (text/plain, multipart) is a client mistake worth naming.
func checkJSON(r *http.Request) error {
	ct := r.Header.Get("Content-Type")
	if ct == "" {
		return nil
	}
	mt, _, err := mime.ParseMediaType(ct)
	if err == nil && (mt == "application/json" || strings.HasSuffix(mt, "+json") || mt == "application/x-www-form-urlencoded") {
		return nil
	}
	return withCode(CodeInvalidInput, fmt.Errorf("%w: Content-Type must be application/json, got %q", kvroute.ErrInvalidInput, ct))
}

// jsonError turns encoding/json's errors into input errors that name the
// field at fault, and leaves transport errors (body too large) alone.
func jsonError(err error) error {
	var (
		fe  *kvroute.FieldError
		mbe *http.MaxBytesError
		ute *json.UnmarshalTypeError
		se  *json.SyntaxError
	)
	switch {
	case errors.As(err, &fe), errors.As(err, &mbe):
		return err
	case errors.As(err, &ute):
		if ute.Field == "" {
			return withCode(CodeInvalidJSON, fmt.Errorf("%w: body must be a JSON object", kvroute.ErrInvalidInput))
		}
		msg := "must be " + article(ute.Type.String()) + ", got " + truncate([]byte(ute.Value))
		if strings.HasPrefix(ute.Value, "number") && strings.HasPrefix(ute.Type.String(), "int") {
			msg = "must be an integer that fits in 64 bits, got " + truncate([]byte(ute.Value))
		}
		return &kvroute.FieldError{Field: ute.Field, Msg: msg}
	case errors.As(err, &se):
		return withCode(CodeInvalidJSON, fmt.Errorf("%w: malformed JSON at byte %d: %v", kvroute.ErrInvalidInput, se.Offset, se))
	case errors.Is(err, io.EOF):
		return withCode(CodeInvalidJSON, fmt.Errorf("%w: request body is empty", kvroute.ErrInvalidInput))
	case errors.Is(err, io.ErrUnexpectedEOF):
		return withCode(CodeInvalidJSON, fmt.Errorf("%w: malformed JSON: unexpected end of body", kvroute.ErrInvalidInput))
	}
	// encoding/json reports unknown fields with a plain error string.
	if name, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
		if f, err := strconv.Unquote(name); err == nil {
			name = f
		}
		return &kvroute.FieldError{Field: name, Msg: "is not a known field"}
	}
	return withCode(CodeInvalidJSON, fmt.Errorf("%w: %v", kvroute.ErrInvalidInput, err))
}

func article(t string) string {
	switch t {
	case "int", "int64", "uint32":
		return "an integer"
	case "string":
		return "a string"
	case "bool":
		return "a boolean"
	}
	return "a " + t
}

// tokenIDs decodes a JSON array of token ids straight into uint32s. It is
// hand-parsed because prompts run to a million ids and reflection-based
// decoding of each one dominates a decision's CPU time, and so that a bad id
// is reported with its index. encoding/json has already checked the syntax
// when UnmarshalJSON is called.
type tokenIDs []uint32

// tokenField is the field tokenIDs errors name; the proxy decodes prompt
// with the same parser and renames the field.
const tokenField = "token_ids"

func (t *tokenIDs) UnmarshalJSON(b []byte) error {
	b = strictjson.TrimSpace(b)
	if string(b) == "null" {
		*t = nil
		return nil
	}
	if len(b) < 2 || b[0] != '[' {
		return &kvroute.FieldError{Field: tokenField, Msg: "must be an array of token ids"}
	}
	b = strictjson.TrimSpace(b[1 : len(b)-1])
	// Exactly one id per comma and one more (bytes.Count is vectorized):
	// a guess from the length over-allocates most prompts by half.
	out := make([]uint32, 0, bytes.Count(b, []byte{','})+1)
	for i := 0; len(b) > 0; i++ {
		// Digits straight into the value (the decoder has checked the
		// syntax, so no leading zeros); at most 10 of them fit 32 bits.
		var v uint64
		j := 0
		for j < len(b) && j <= 10 && b[j]-'0' <= 9 {
			v = v*10 + uint64(b[j]-'0')
			j++
		}
		if j == 0 || v > math.MaxUint32 || (j < len(b) && !isSep(b[j])) {
			for j < len(b) && !isSep(b[j]) {
				j++
			}
			return &kvroute.FieldError{Field: tokenField, Msg: fmt.Sprintf("element %d must be an integer in [0, 4294967295], got %s", i, truncate(b[:j]))}
		}
		out = append(out, uint32(v))
		b = b[j:]
		if len(b) > 0 && b[0] != ',' {
			b = strictjson.TrimSpace(b)
		}
		if len(b) > 0 {
			if b[0] != ',' {
				// A string or nested value with spaces inside it.
				return &kvroute.FieldError{Field: tokenField, Msg: fmt.Sprintf("element %d must be an integer", i)}
			}
			b = b[1:]
			if len(b) > 0 && b[0] <= ' ' {
				b = strictjson.TrimSpace(b)
			}
		}
	}
	*t = out
	return nil
}

// isSep reports whether c ends a token id: a comma or JSON whitespace.
func isSep(c byte) bool { return c == ',' || c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func truncate(b []byte) string {
	if len(b) > 24 {
		return string(b[:24]) + "..."
	}
	return string(b)
}
