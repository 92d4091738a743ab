package api_test

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
)

// hostile is one request an attacker or a broken client sends. field is
// the field its 400 must name ("" for a body that is not JSON at all,
// which is named by its code instead).
type hostile struct {
	name, method, path, body string
	status                   int
	field                    string
}

func manyLabelsJSON(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"m","url":"http://x:8000","labels":{`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, `"k%d":"v"`, i)
	}
	b.WriteString(`}}`)
	return b.String()
}

func hostileInputs() []hostile {
	deep := func(n int) string { return strings.Repeat("[", n) + strings.Repeat("]", n) }
	route := func(name, body string, status int, field string) hostile {
		return hostile{name, http.MethodPost, "/v1/route", body, status, field}
	}
	proxy := func(name, body string, field string) hostile {
		return hostile{name, http.MethodPost, "/v1/completions", body, 400, field}
	}
	put := func(name, id, body, field string) hostile {
		return hostile{name, http.MethodPut, "/v1/replicas/" + id, body, 400, field}
	}
	return []hostile{
		// Wrong types.
		route("model a number", `{"model":5,"token_ids":[1]}`, 400, "model"),
		route("token ids a string", `{"model":"m","token_ids":"1,2"}`, 400, "token_ids"),
		route("token ids an object", `{"model":"m","token_ids":{"0":1}}`, 400, "token_ids"),
		route("nested token ids", `{"model":"m","token_ids":[[1]]}`, 400, "token_ids"),
		route("max_tokens a string", `{"model":"m","token_ids":[1],"max_tokens":"10"}`, 400, "max_tokens"),
		route("explain a string", `{"model":"m","token_ids":[1],"explain":"yes"}`, 400, "explain"),
		route("policy a number", `{"model":"m","token_ids":[1],"policy":1}`, 400, "policy"),
		route("messages an object", `{"model":"m","messages":{}}`, 400, "messages"),
		route("prompt null and ids", `{"model":"m","prompt":"x","token_ids":[1]}`, 400, "token_ids"),
		proxy("proxy prompt an object", `{"model":"m","prompt":{"a":1}}`, "prompt"),
		proxy("proxy stream a string", `{"model":"m","prompt":[1],"stream":"yes"}`, "stream"),
		proxy("proxy stream options an array", `{"model":"m","prompt":[1],"stream":true,"stream_options":[1]}`, "stream_options"),
		put("labels an array", "x", `{"model":"m","url":"http://x:8000","labels":[]}`, "labels"),
		put("block size a string", "x", `{"model":"m","url":"http://x:8000","block_size":"16"}`, "block_size"),
		put("health a number", "x", `{"model":"m","url":"http://x:8000","health":1}`, "health"),
		// Huge arrays and maps, deep nesting.
		route("too many token ids", `{"model":"m","token_ids":`+tokenJSON(0, 2001)+`}`, 400, "token_ids"),
		put("100,000 labels", "x", manyLabelsJSON(100_000), "labels"),
		put("a 200 KB label", "x", `{"model":"m","url":"http://x:8000","labels":{"k":"`+strings.Repeat("v", 200<<10)+`"}}`, "labels"),
		route("deep kwargs", `{"model":"m","messages":[],"chat_template_kwargs":{"a":`+deep(5000)+`}}`, 400, "chat_template_kwargs"),
		route("deep messages", `{"model":"m","messages":`+deep(129)+`}`, 400, "messages"),
		proxy("proxy deep body", `{"model":"m","prompt":[1],"extra":`+deep(200)+`}`, "extra"),
		// Invalid UTF-8.
		route("model invalid utf-8", "{\"model\":\"m\xff\",\"token_ids\":[1]}", 400, "model"),
		route("prompt invalid utf-8", "{\"model\":\"m\",\"prompt\":\"\xc0\xaf\"}", 400, "prompt"),
		route("key invalid utf-8", "{\"model\":\"m\",\"token_ids\":[1],\"\xff\":1}", 400, "\ufffd"),
		put("label invalid utf-8", "x", "{\"model\":\"m\",\"url\":\"http://x:8000\",\"labels\":{\"k\":\"\xfe\"}}", "labels.k"),
		proxy("proxy lone surrogate", `{"model":"m","prompt":"\udc00"}`, "prompt"),
		// Negative and huge numbers.
		route("negative token id", `{"model":"m","token_ids":[-1]}`, 400, "token_ids"),
		route("token id 1e400", `{"model":"m","token_ids":[1e400]}`, 400, "token_ids"),
		route("negative max_tokens", `{"model":"m","token_ids":[1],"max_tokens":-1}`, 400, "max_tokens"),
		route("max_tokens 1e400", `{"model":"m","token_ids":[1],"max_tokens":1e400}`, 400, "max_tokens"),
		route("max_tokens 2^63", `{"model":"m","token_ids":[1],"max_tokens":9223372036854775808}`, 400, "max_tokens"),
		route("max_tokens 2^63-1", `{"model":"m","token_ids":[1],"max_tokens":9223372036854775807}`, 400, "max_tokens"),
		proxy("proxy negative max_tokens", `{"model":"m","prompt":[1],"max_tokens":-7}`, "max_tokens"),
		put("negative block size", "x", `{"model":"m","url":"http://x:8000","block_size":-1}`, "block_size"),
		put("huge block size", "x", `{"model":"m","url":"http://x:8000","block_size":1e9}`, "block_size"),
		// Unknown policy and fields.
		route("unknown policy", `{"model":"m","token_ids":[1],"policy":"fastest"}`, 400, "policy"),
		route("case-variant field", `{"model":"m","Token_IDs":[1]}`, 400, "Token_IDs"),
		route("duplicate field", `{"model":"m","token_ids":[1],"token_ids":[2]}`, 400, "token_ids"),
		// Bad ids and URLs.
		put("id with a space", "a%20b", `{"model":"m","url":"http://x:8000"}`, "id"),
		put("id too long", strings.Repeat("a", 129), `{"model":"m","url":"http://x:8000"}`, "id"),
		put("id mismatch", "x", `{"id":"y","model":"m","url":"http://x:8000"}`, "id"),
		put("file url", "x", `{"model":"m","url":"file:///etc/passwd"}`, "url"),
		put("metadata url", "x", `{"model":"m","url":"http://169.254.169.254/latest/meta-data/"}`, "url"),
		put("gopher url", "x", `{"model":"m","url":"gopher://127.0.0.1:6379/_FLUSHALL"}`, "url"),
		put("not a url", "x", `{"model":"m","url":"not a url"}`, "url"),
		put("javascript url", "x", `{"model":"m","url":"javascript:alert(1)"}`, "url"),
		put("credentials", "x", `{"model":"m","url":"http://user:pass@x:8000"}`, "url"),
		put("events at metadata", "x", `{"model":"m","url":"http://x:8000","events":"tcp://169.254.169.254:5557"}`, "events"),
		put("replay not tcp", "x", `{"model":"m","url":"http://x:8000","replay":"http://x:5558"}`, "replay"),
		put("model too long", "x", `{"model":"`+strings.Repeat("m", 300)+`","url":"http://x:8000"}`, "model"),
		put("model with a newline", "x", `{"model":"m\n","url":"http://x:8000"}`, "model"),
		put("health out of its enum", "x", `{"model":"m","url":"http://x:8000","health":"dead"}`, "health"),
		// Not JSON.
		route("truncated", `{"model":"m","token_ids":[1`, 400, ""),
		route("garbage", "\x00\x01\x02", 400, ""),
		route("array body", `[{"model":"m"}]`, 400, ""),
		proxy("proxy truncated", `{"model":"m","prompt":"`, ""),
		route("long cache salt", `{"model":"m","token_ids":[1],"cache_salt":"`+strings.Repeat("s", 1025)+`"}`, 400, "cache_salt"),
		route("long session", `{"model":"m","token_ids":[1],"session_id":"`+strings.Repeat("s", 1025)+`"}`, 400, "session_id"),
		proxy("proxy long cache salt", `{"model":"m","prompt":[1],"cache_salt":"`+strings.Repeat("s", 1025)+`"}`, "cache_salt"),
		// Query parameters.
		{"redirect not a boolean", http.MethodPost, "/v1/completions?redirect=maybe", `{"model":"m","prompt":[1]}`, 400, "redirect"},
		{"route redirect", http.MethodPost, "/v1/route?redirect=true", `{"model":"m","token_ids":[1]}`, 400, "redirect"},
	}
}

// TestHostileInputs: each hostile request gets its 4xx with a JSON body
// naming the field, the server stays up, and neither the registry nor any
// load changes.
func TestHostileInputs(t *testing.T) {
	up := newUpstream(t, http.StatusOK)
	reps := append(fleet(1, "m"), up.replica("p0"))
	reps[1].Model = "m"
	h := newHarness(t, reps, func(c *api.Config) { c.MaxTokens = 2000 })
	before := h.registry(t)
	for _, tt := range hostileInputs() {
		t.Run(tt.name, func(t *testing.T) {
			status, hdr, raw := h.do(t, tt.method, tt.path, "application/json", tt.body)
			if status != tt.status {
				t.Fatalf("status %d, want %d; body %.300s", status, tt.status, raw)
			}
			if ct := hdr.Get("Content-Type"); ct != "application/json" {
				t.Errorf("Content-Type %q", ct)
			}
			var any map[string]json.RawMessage
			if err := json.Unmarshal([]byte(raw), &any); err != nil || any["error"] == nil {
				t.Fatalf("not a JSON error: %.300s", raw)
			}
			if got := errorField(t, raw); got != tt.field {
				t.Errorf("field %q, want %q; body %.300s", got, tt.field, raw)
			}
		})
	}
	if after := h.registry(t); after != before {
		t.Errorf("state changed:\n%s\nthen\n%s", before, after)
	}
	if status, _, _ := h.do(t, http.MethodGet, "/healthz", "", ""); status != http.StatusOK {
		t.Errorf("healthz after the table: %d", status)
	}
	select {
	case r := <-up.got:
		t.Errorf("a hostile request reached the replica: %s %.200s", r.path, r.body)
	default:
	}
	for _, id := range []string{"r0", "p0"} {
		if l := h.store.Load(id); l != (kvroute.Load{}) {
			t.Errorf("%s load %+v, want none", id, l)
		}
	}
}
