package tokenizer_test

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvroute/kvroute/internal/testfiles"
	"github.com/kvroute/kvroute/tokenizer"
)

// variant is one entry of testdata/variants.json: a shipped tokenizer
// with components swapped for ones no shipped tokenizer uses.
type variant struct {
	Name      string                     `json:"name"`
	Base      string                     `json:"base"`
	Set       map[string]json.RawMessage `json:"set"`
	Model     map[string]json.RawMessage `json:"model"`
	AddTokens []map[string]any           `json:"add_tokens"`
}

// buildVariant applies v to its base tokenizer.json exactly as
// gen/variants.js does.
func buildVariant(tb testing.TB, v variant) *tokenizer.Tokenizer {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(testfiles.Tokenizer(tb, v.Base), "tokenizer.json"))
	if err != nil {
		tb.Fatal(err)
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(data, &top); err != nil {
		tb.Fatal(err)
	}
	for k, raw := range v.Set {
		top[k] = raw
	}
	var model map[string]json.RawMessage
	if err := json.Unmarshal(top["model"], &model); err != nil {
		tb.Fatal(err)
	}
	for k, raw := range v.Model {
		model[k] = raw
	}
	var vocab map[string]uint32
	if err := json.Unmarshal(model["vocab"], &vocab); err != nil {
		tb.Fatal(err)
	}
	var added []map[string]any
	if err := json.Unmarshal(top["added_tokens"], &added); err != nil {
		tb.Fatal(err)
	}
	next := float64(len(vocab))
	for _, t := range added {
		next = max(next, t["id"].(float64)+1)
	}
	for _, t := range v.AddTokens {
		t["id"] = next
		next++
		added = append(added, t)
	}
	marshal := func(x any) json.RawMessage {
		b, err := json.Marshal(x)
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	top["model"] = marshal(model)
	top["added_tokens"] = marshal(added)
	tok, err := tokenizer.FromJSON(marshal(top))
	if err != nil {
		tb.Fatalf("variant %s: %v", v.Name, err)
	}
	return tok
}

type variantLine struct {
	Variant string   `json:"variant"`
	Text    string   `json:"text"`
	Plain   []uint32 `json:"plain"`
	Special []uint32 `json:"special"`
}

// TestParityVariants holds the components the shipped tokenizers do not
// use to Hugging Face's goldens, through cached and uncached encoding.
func TestParityVariants(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("testdata", "variants.json"))
	if err != nil {
		t.Fatal(err)
	}
	var variants []variant
	if err := json.Unmarshal(data, &variants); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(filepath.Join("testdata", "golden", "variants.jsonl.gz"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	byVariant := map[string][]variantLine{}
	sc := bufio.NewScanner(zr)
	sc.Buffer(nil, 1<<24)
	sc.Scan() // header
	for sc.Scan() {
		var l variantLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatal(err)
		}
		byVariant[l.Variant] = append(byVariant[l.Variant], l)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	for _, v := range variants {
		t.Run(v.Name, func(t *testing.T) {
			lines := byVariant[v.Name]
			if len(lines) == 0 {
				t.Fatalf("no goldens for %s: regenerate (testdata/README.md)", v.Name)
			}
			tok := buildVariant(t, v)
			c := tokenizer.NewCache(tok, 1<<20)
			bad := 0
			for _, l := range lines {
				for _, cs := range []struct {
					special bool
					want    []uint32
				}{{false, l.Plain}, {true, l.Special}} {
					got, err := tok.Encode(l.Text, cs.special)
					if err != nil {
						t.Fatal(err)
					}
					cached, err := c.Encode(l.Text, cs.special)
					if err != nil {
						t.Fatal(err)
					}
					d := diffIDs(got, cs.want)
					if d == "" {
						if cd := diffIDs(cached, cs.want); cd != "" {
							d = "cached: " + cd
						}
					}
					if d != "" {
						bad++
						if bad <= 8 {
							t.Errorf("%q, addSpecialTokens=%v: %s", l.Text, cs.special, d)
						}
					}
				}
			}
			if bad > 0 {
				t.Errorf("%d of %d encodings differ from Hugging Face", bad, 2*len(lines))
			}
		})
	}
}
