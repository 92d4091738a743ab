package strictjson_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/strictjson"
)

type inner struct {
	Tools json.RawMessage `json:"tools"`
}

type body struct {
	Model    string          `json:"model"`
	TokenIDs []uint32        `json:"token_ids"`
	Messages json.RawMessage `json:"messages"`
	inner
	Plain  int
	Hidden int `json:"-"`
	secret int
}

var (
	known = strictjson.Fields(reflect.TypeFor[body]())
	take  = &strictjson.Take{Tokens: "token_ids", Raw: []string{"messages", "tools"}}
)

// errField is the field err names ("" for none), failing on an error that
// is not a FieldError.
func errField(tb testing.TB, err error) string {
	tb.Helper()
	if err == nil {
		return ""
	}
	var fe *kvroute.FieldError
	if !errors.As(err, &fe) {
		tb.Fatalf("error %v is not a *kvroute.FieldError", err)
	}
	return fe.Field
}

func TestFields(t *testing.T) {
	got := slices.Sorted(func(yield func(string) bool) {
		for k := range known {
			if !yield(k) {
				return
			}
		}
	})
	want := []string{"Plain", "messages", "model", "token_ids", "tools"}
	if !slices.Equal(got, want) {
		t.Errorf("got %v, want %v", got, want)
	}
}

func TestCheck(t *testing.T) {
	tests := []struct {
		name, body string
		exact      bool
		field      string
	}{
		{"clean", `{"model":"m","token_ids":[1,2]}`, true, ""},
		{"unknown field, exact", `{"model":"m","bogus":1}`, true, "bogus"},
		{"unknown field, lenient", `{"model":"m","bogus":1}`, false, ""},
		{"case variant, lenient", `{"MODEL":"m"}`, false, "MODEL"},
		{"duplicate", `{"model":"m","model":"x"}`, false, "model"},
		{"escaped duplicate", `{"model":"m","mod\u0065l":"x"}`, false, "model"},
		{"nested duplicate", `{"messages":[{"role":"a","role":"b"}]}`, false, "messages[0].role"},
		{"invalid utf-8", "{\"model\":\"a\xffb\"}", false, "model"},
		{"lone surrogate", `{"model":"a\ud800b"}`, false, "model"},
		{"surrogate pair", `{"model":"\ud83d\ude00"}`, false, ""},
		{"too deep", `{"tools":` + strings.Repeat("[", strictjson.MaxDepth+1) + strings.Repeat("]", strictjson.MaxDepth+1) + `}`, false, "tools"},
		{"malformed is the decoder's", `{"model":`, true, ""},
		{"not an object", `[1,2]`, true, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := strictjson.Check([]byte(tt.body), known, tt.exact)
			if got := errField(t, err); got != tt.field {
				t.Errorf("got field %q (%v), want %q", got, err, tt.field)
			}
		})
	}
}

func TestScanTakes(t *testing.T) {
	raw := `{"model":"m", "token_ids":[ 3, 1 ,4 ],"messages":[{"role":"user","content":"hi"}],"tools":[1,]}`
	got, err := strictjson.Scan([]byte(raw), known, true, take)
	if err != nil {
		t.Fatal(err)
	}
	if want := []uint32{3, 1, 4}; !slices.Equal(got.IDs, want) {
		t.Errorf("got ids %v, want %v", got.IDs, want)
	}
	var fields []string
	for _, sp := range got.Spans {
		fields = append(fields, sp.Field)
	}
	// tools is malformed: left in place for the decoder to report.
	if want := []string{"token_ids", "messages"}; !slices.Equal(fields, want) {
		t.Errorf("got spans of %v, want %v", fields, want)
	}
	if got, want := string(got.Without([]byte(raw))), `{"model":"m", "token_ids":null,"messages":null,"tools":[1,]}`; got != want {
		t.Errorf("got without %s, want %s", got, want)
	}
	t.Run("syntax error takes nothing", func(t *testing.T) {
		got, err := strictjson.Scan([]byte(`{"token_ids":[1],"model":"m"`), known, true, take)
		if err != nil || len(got.Spans) != 0 || got.IDs != nil {
			t.Errorf("got %+v, %v; want nothing taken, no error", got, err)
		}
	})
}

func TestTrimSpace(t *testing.T) {
	if got, want := string(strictjson.TrimSpace([]byte(" \t\r\n[1]\f \n"))), "[1]\f"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
}

func TestPool(t *testing.T) {
	var p strictjson.Pool[byte]
	for _, n := range []int{0, 1, 4096, 5000, 1 << 20, 1<<24 + 1} {
		t.Run(fmt.Sprint(n), func(t *testing.T) {
			s := p.Get(n)
			if len(s) != 0 || cap(s) < n {
				t.Fatalf("got len %d cap %d, want len 0, cap >= %d", len(s), cap(s), n)
			}
			p.Put(append(s, 1))
		})
	}
}

// FuzzScan holds two claims of the scan: taking fields changes no error
// (Scan with take answers what Check answers), and what it takes is
// well formed (the raw spans are JSON, the ids what encoding/json reads).
func FuzzScan(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","token_ids":[1,2,3]}`,
		`{"model":"m","messages":[{"role":"user","content":"x\u00e9"}],"tools":[1,2,{"a":[3,4.5e-1]}]}`,
		`{"model":"m","token_ids":[01],"tools":[-]}`,
		`{"messages":[{"a":1e}],"token_ids":[4294967296]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		got, err := strictjson.Scan(b, known, false, take)
		if want := strictjson.Check(b, known, false); fmt.Sprint(err) != fmt.Sprint(want) {
			t.Fatalf("Scan error %v, Check error %v", err, want)
		}
		for _, sp := range got.Spans {
			v := b[sp.Start:sp.End]
			if !json.Valid(v) {
				t.Fatalf("took %s as %q, not JSON", sp.Field, v)
			}
			if sp.Field != take.Tokens {
				continue
			}
			var ids []uint32
			if err := json.Unmarshal(v, &ids); err != nil || !slices.Equal(ids, got.IDs) {
				t.Fatalf("took ids %v from %q; encoding/json reads %v (%v)", got.IDs, v, ids, err)
			}
		}
	})
}
