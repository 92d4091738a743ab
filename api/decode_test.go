package api_test

import (
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/api"
)

// decodeCases are /v1/route bodies whose token ids the strict scan parses
// itself (or declines to, leaving them to encoding/json).
var decodeCases = map[string]string{
	"plain":                 `{"model":"m","token_ids":[1,2,3]}`,
	"spaces and newlines":   "{\"model\":\"m\",\"token_ids\": [ 1 ,\n2\t,\r\n 3 ] }",
	"empty":                 `{"model":"m","token_ids":[]}`,
	"empty with space":      `{"model":"m","token_ids":[ ]}`,
	"zero and max":          `{"model":"m","token_ids":[0,4294967295]}`,
	"first field":           `{"token_ids":[7],"model":"m","max_tokens":3}`,
	"null":                  `{"model":"m","token_ids":null}`,
	"absent":                `{"model":"m","prompt":"hi"}`,
	"too large":             `{"model":"m","token_ids":[4294967296]}`,
	"eleven digits":         `{"model":"m","token_ids":[12345678901]}`,
	"negative":              `{"model":"m","token_ids":[1,-1]}`,
	"fraction":              `{"model":"m","token_ids":[1.5]}`,
	"exponent":              `{"model":"m","token_ids":[1e3]}`,
	"leading zero":          `{"model":"m","token_ids":[01]}`,
	"trailing comma":        `{"model":"m","token_ids":[1,]}`,
	"missing comma":         `{"model":"m","token_ids":[1 2]}`,
	"string element":        `{"model":"m","token_ids":[1,"2"]}`,
	"nested":                `{"model":"m","token_ids":[1,[2]]}`,
	"unclosed":              `{"model":"m","token_ids":[1,2`,
	"twice":                 `{"model":"m","token_ids":[1],"token_ids":[2]}`,
	"case variant":          `{"model":"m","Token_IDs":[1]}`,
	"syntax error after":    `{"model":"m","token_ids":[1,2,3],"max_tokens":}`,
	"unknown field after":   `{"model":"m","token_ids":[1,2,3],"bogus":1}`,
	"trailing data":         `{"model":"m","token_ids":[1,2,3]} {}`,
	"bad type after":        `{"model":"m","token_ids":[1],"max_tokens":"x"}`,
	"nested token_ids name": `{"model":"m","messages":[{"role":"user","content":"x","token_ids":[1]}]}`,
	"not an array":          `{"model":"m","token_ids":"1,2"}`,
	"messages":              `{"model":"m","messages":[{"role":"user","content":"hi \u00e9\n"}],"max_tokens":3}`,
	"messages with spaces":  "{\"model\":\"m\", \"messages\" : [ {\"role\": \"user\", \"content\": \"x\"} ] , \"explain\": true}",
	"messages and tools":    `{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"}]}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"n":{"type":"integer","minimum":-1.5e3,"default":0}}}}}],"chat_template_kwargs":{"enable_thinking":false,"x":null},"documents":[]}`,
	"messages null":         `{"model":"m","messages":null}`,
	"messages not array":    `{"model":"m","messages":{"role":"user"}}`,
	"bad literal inside":    `{"model":"m","messages":[{"role":"user","content":tru}]}`,
	"bad number inside":     `{"model":"m","messages":[{"role":"user","n":01}]}`,
	"bare minus inside":     `{"model":"m","tools":[-]}`,
	"bad fraction inside":   `{"model":"m","tools":[1.]}`,
	"bad exponent inside":   `{"model":"m","chat_template_kwargs":{"a":1e}}`,
	"numbers inside":        `{"model":"m","chat_template_kwargs":{"a":[0,-0,1.25,2E+3,4e-2,12345678901234567890]}}`,
	"duplicate inside":      `{"model":"m","messages":[{"role":"user","role":"system"}]}`,
	"lone surrogate inside": `{"model":"m","messages":[{"role":"user","content":"\ud800"}]}`,
	"unclosed messages":     `{"model":"m","messages":[{"role":"user"}`,
	"messages and ids":      `{"model":"m","messages":[],"token_ids":[1]}`,
	"bad escape inside":     `{"model":"m","messages":[{"role":"user","content":"a\qb"}]}`,
	"good escapes inside":   `{"model":"m","messages":[{"role":"user","content":"\"\\\/\b\f\n\r\t\u0041"}]}`,
	"trailing comma inside": `{"model":"m","tools":[1,]}`,
	"comma then string":     `{"model":"m","tools":[1, "a"]}`,
	"no comma then string":  `{"model":"m","tools":[1 "a"]}`,
	"string trailing comma": `{"model":"m","tools":["a",]}`,
	"empty value inside":    `{"model":"m","chat_template_kwargs":{"a":}}`,
	"form feed inside":      "{\"model\":\"m\",\"tools\":[\f1]}",
	"numbers then object":   `{"model":"m","tools":[1,2,{"a":[3,4.5e-1]}]}`,
}

// TestDecodeRouteRequest holds the single-pass decode to the answers and
// the errors of decoding the whole body with encoding/json.
func TestDecodeRouteRequest(t *testing.T) {
	long := make([]string, 5000)
	for i := range long {
		long[i] = fmt.Sprint(i * 7919 % 151000)
	}
	cases := map[string]string{"long": `{"model":"m","token_ids":[` + strings.Join(long, ", ") + `]}`}
	for name, body := range decodeCases {
		cases[name] = body
	}
	for name, body := range cases {
		t.Run(name, func(t *testing.T) {
			checkDecode(t, []byte(body))
		})
	}
}

func checkDecode(tb testing.TB, body []byte) {
	tb.Helper()
	got, gotErr := api.DecodeRouteRequest(body)
	want, wantErr := api.DecodeRouteRequestUnspliced(body)
	if fmt.Sprint(gotErr) != fmt.Sprint(wantErr) {
		tb.Fatalf("error = %v, want %v", gotErr, wantErr)
	}
	if gotErr == nil && !reflect.DeepEqual(got, want) {
		tb.Fatalf("decoded %+v, want %+v", got, want)
	}
}

// proxyCases are OpenAI bodies for the proxy's decode, beside decodeCases.
var proxyCases = map[string]string{
	"prompt text":        `{"model":"m","prompt":"Once upon a time","max_tokens":5,"stream":true}`,
	"prompt batch":       `{"model":"m","prompt":["a","b"]}`,
	"prompt ids":         `{"model":"m","prompt":[1,2,3],"temperature":0.5}`,
	"prompt id batch":    `{"model":"m","prompt":[[1,2],[3]]}`,
	"prompt bad literal": `{"model":"m","prompt":[1,2,tru]}`,
	"prompt embeds":      `{"model":"m","prompt_embeds":"AAAA"}`,
	"chat":               `{"model":"m","messages":[{"role":"user","content":"hi"}],"stream_options":{"include_usage":true},"n":1}`,
	"chat unknown field": `{"model":"m","messages":[],"logit_bias":{"1":-100}}`,
	"chat case variant":  `{"model":"m","Messages":[]}`,
	"ids and prompt":     `{"model":"m","token_ids":[5,6],"prompt":"x"}`,
}

// TestProxyDecode holds the proxy's decode, which takes the large fields
// in its scan, to decoding the whole body with encoding/json.
func TestProxyDecode(t *testing.T) {
	for name, body := range proxyCases {
		t.Run(name, func(t *testing.T) {
			if diff := api.ProxyDecodeParity([]byte(body)); diff != "" {
				t.Fatal(diff)
			}
		})
	}
	for name, body := range decodeCases {
		t.Run("route body "+name, func(t *testing.T) {
			if diff := api.ProxyDecodeParity([]byte(body)); diff != "" {
				t.Fatal(diff)
			}
		})
	}
}

// FuzzDecodeRouteRequest looks for a body on which either decode (the
// /v1/route handler's, the proxy's) disagrees with decoding the whole body
// with encoding/json.
func FuzzDecodeRouteRequest(f *testing.F) {
	for _, body := range decodeCases {
		f.Add([]byte(body))
	}
	for _, body := range proxyCases {
		f.Add([]byte(body))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		checkDecode(t, body)
		if diff := api.ProxyDecodeParity(body); diff != "" {
			t.Fatalf("proxy: %s", diff)
		}
	})
}

// BenchmarkDecodeRouteRequest decodes a 2,048-block (32,768-token) body
// with the single-pass decode and with encoding/json over all of it.
//
//	go test -run '^$' -bench DecodeRouteRequest ./api
func BenchmarkDecodeRouteRequest(b *testing.B) {
	ids := make([]string, 2048*16)
	for i := range ids {
		ids[i] = fmt.Sprint(i * 7919 % 151000)
	}
	body := []byte(`{"model":"bench","token_ids":[` + strings.Join(ids, ",") + `],"max_tokens":64}`)
	for _, d := range []struct {
		name string
		f    func([]byte) (api.RouteRequest, error)
	}{{"single-pass", api.DecodeRouteRequest}, {"encoding-json", api.DecodeRouteRequestUnspliced}} {
		b.Run(d.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := d.f(body); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
