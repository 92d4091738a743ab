package template_test

import (
	"encoding/json"
	"testing"

	"github.com/kvroute/kvroute/tokenizer/template"
)

// TestDecodeJSONStrings holds the request decoder's strings to what
// encoding/json (and so the api's decode, and Python's json.loads for
// valid input) reads: escapes, surrogate pairs, and invalid UTF-8 or lone
// surrogates turned into U+FFFD.
func TestDecodeJSONStrings(t *testing.T) {
	for name, raw := range map[string]string{
		"plain":           `"hello world"`,
		"empty":           `""`,
		"escapes":         `"a\nb\t\"c\"\\d\/e"`,
		"unicode escape":  `"caf\u00e9"`,
		"surrogate pair":  `"\ud83d\ude00"`,
		"lone surrogate":  `"x\ud800y"`,
		"invalid utf-8":   "\"a\xffb\"",
		"utf-8 and quote": "\"é \\\" ü\"",
	} {
		t.Run(name, func(t *testing.T) {
			var want string
			if err := json.Unmarshal([]byte(raw), &want); err != nil {
				t.Fatal(err)
			}
			got, err := template.DecodeJSON([]byte(raw))
			if err != nil || got != want {
				t.Errorf("decode %q = %q, %v; want %q", raw, got, err, want)
			}
		})
	}
}
