package kvroute_test

import (
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
)

var update = flag.Bool("update", false, "rewrite testdata golden files")

const bs = kvroute.DefaultBlockSize

// matched counts the leading keys two chains share: what a replica holding
// the first chain can serve of the second.
func matched(a, b []kvroute.BlockKey) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

func randTokens(r *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(r.IntN(50_000))
	}
	return t
}

func flip(t []uint32, i int) []uint32 {
	out := append([]uint32(nil), t...)
	out[i] = (out[i] + 1) % 50_000
	return out
}

// TestBlockBoundaries reproduces the seed's block-boundary section: the
// match is decided per block, never per token.
func TestBlockBoundaries(t *testing.T) {
	r := rand.New(rand.NewPCG(20260826, 1))
	ks := kvroute.KeySpace{Model: "m"}
	base := randTokens(r, 9*bs+9) // 9 full blocks and a 9-token tail
	keys := kvroute.BlockKeys(ks, bs, base, nil)
	if got, want := len(keys), 9; got != want {
		t.Fatalf("len(keys) = %d, want %d", got, want)
	}
	tests := []struct {
		name   string
		tokens []uint32
		want   int
	}{
		{"identical", base, 9},
		{"last token of block 3", flip(base, 4*bs-1), 3},
		{"first token of block 4", flip(base, 4*bs), 4},
		{"inside trailing partial block", flip(base, 9*bs+3), 9},
		{"one token prepended", append([]uint32{7}, base...), 0},
		{"shorter than one block", base[:bs-1], 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := matched(keys, kvroute.BlockKeys(ks, bs, tt.tokens, nil))
			if got != tt.want {
				t.Errorf("matched blocks = %d, want %d", got, tt.want)
			}
		})
	}
	t.Run("no keys below one block", func(t *testing.T) {
		if got := kvroute.BlockKeys(ks, bs, base[:bs-1], nil); len(got) != 0 {
			t.Errorf("got %d keys for %d tokens, want 0", len(got), bs-1)
		}
	})
}

// TestKeySpaces checks that whatever must isolate caches does: a different
// salt, adapter, model or seed shares no key with the original.
func TestKeySpaces(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	tokens := randTokens(r, 8*bs)
	ks := kvroute.KeySpace{Model: "m", Seed: 1}
	orig := kvroute.BlockKeys(ks, bs, tokens, nil)
	tests := []struct {
		name string
		keys []kvroute.BlockKey
	}{
		{"cache salt", kvroute.BlockKeys(ks, bs, tokens, kvroute.RequestExtras("tenant-a"))},
		{"lora", kvroute.BlockKeys(kvroute.KeySpace{Model: "m", LoRA: "sql", Seed: 1}, bs, tokens, nil)},
		{"model", kvroute.BlockKeys(kvroute.KeySpace{Model: "m2", Seed: 1}, bs, tokens, nil)},
		{"seed", kvroute.BlockKeys(kvroute.KeySpace{Model: "m", Seed: 2}, bs, tokens, nil)},
		{"block size", kvroute.BlockKeys(ks, 2*bs, tokens, nil)},
		{"mm item", kvroute.BlockKeys(ks, bs, tokens, []kvroute.BlockExtra{{}, {MM: []kvroute.MMRef{{ID: "img", Offset: 0}}}})},
	}
	seen := map[kvroute.BlockKey]bool{}
	for _, k := range orig {
		seen[k] = true
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			shared := 0
			for _, k := range tt.keys {
				if seen[k] {
					shared++
				}
			}
			// The MM item sits on block 1, so block 0 is rightly shared.
			want := 0
			if tt.name == "mm item" {
				want = 1
			}
			if shared != want {
				t.Errorf("shared keys = %d, want %d", shared, want)
			}
		})
	}
}

// TestExtrasUnambiguous feeds pairs of extras that a naive concatenation
// would serialize identically.
func TestExtrasUnambiguous(t *testing.T) {
	tokens := make([]uint32, bs)
	pairs := []struct {
		name string
		a, b kvroute.BlockExtra
	}{
		{"salt split", kvroute.BlockExtra{Salt: "ab"}, kvroute.BlockExtra{Salt: "a", Other: []string{"b"}}},
		{"salt vs other", kvroute.BlockExtra{Salt: "x"}, kvroute.BlockExtra{Other: []string{"x"}}},
		{"other split", kvroute.BlockExtra{Other: []string{"ab", "c"}}, kvroute.BlockExtra{Other: []string{"a", "bc"}}},
		{"mm offset", kvroute.BlockExtra{MM: []kvroute.MMRef{{ID: "i", Offset: 1}}}, kvroute.BlockExtra{MM: []kvroute.MMRef{{ID: "i", Offset: 2}}}},
		{"mm id vs other", kvroute.BlockExtra{MM: []kvroute.MMRef{{ID: "i"}}}, kvroute.BlockExtra{Other: []string{"i"}}},
		{"empty vs salt", kvroute.BlockExtra{}, kvroute.BlockExtra{Salt: "\x00"}},
	}
	for _, p := range pairs {
		t.Run(p.name, func(t *testing.T) {
			a := kvroute.ChainKeys(nil, 1, bs, tokens, []kvroute.BlockExtra{p.a})
			b := kvroute.ChainKeys(nil, 1, bs, tokens, []kvroute.BlockExtra{p.b})
			if a[0] == b[0] {
				t.Errorf("%+v and %+v share key %v", p.a, p.b, a[0])
			}
		})
	}
}

// TestChainContinues checks that keying a prompt in pieces, each continued
// from the last key of the one before (as the ingestor does with events),
// gives the keys a request computes in one go.
func TestChainContinues(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	ks := kvroute.KeySpace{Model: "m"}
	tokens := randTokens(r, 10*bs)
	extras := kvroute.RequestExtras("salt")
	whole := kvroute.BlockKeys(ks, bs, tokens, extras)
	parts := kvroute.ChainKeys(nil, ks.Root(), bs, tokens[:3*bs], extras)
	parts = kvroute.ChainKeys(parts, parts[len(parts)-1], bs, tokens[3*bs:], nil)
	if matched(whole, parts) != len(whole) || len(parts) != len(whole) {
		t.Errorf("chained keys differ from whole-prompt keys:\n got %v\nwant %v", parts, whole)
	}
}

// TestGoldenKeys pins the key function. If it fails, the derivation changed
// and every index in every deployed Redis is void: bump keyVersion instead.
// Run `go test -run TestGoldenKeys -update` to rewrite testdata/keys.golden.
func TestGoldenKeys(t *testing.T) {
	seq := func(n int) []uint32 {
		t := make([]uint32, n)
		for i := range t {
			t[i] = uint32(i + 1)
		}
		return t
	}
	cases := []struct {
		name   string
		ks     kvroute.KeySpace
		bs     int
		tokens []uint32
		extras []kvroute.BlockExtra
	}{
		{"tokens 1..32 bs16", kvroute.KeySpace{Model: "llama"}, 16, seq(32), nil},
		{"tokens 1..32 bs16 salt", kvroute.KeySpace{Model: "llama"}, 16, seq(32), kvroute.RequestExtras("s1")},
		{"tokens 1..32 bs16 lora", kvroute.KeySpace{Model: "llama", LoRA: "a"}, 16, seq(32), nil},
		{"tokens 1..64 bs32 seed7", kvroute.KeySpace{Model: "qwen", Seed: 7}, 32, seq(64), nil},
		{"mm and other", kvroute.KeySpace{Model: "llava"}, 16, seq(32), []kvroute.BlockExtra{{MM: []kvroute.MMRef{{ID: "img0", Offset: 3}}}, {Other: []string{"e"}}}},
	}
	var b strings.Builder
	b.WriteString("# Golden block keys. Made by `go test -run TestGoldenKeys -update` from the cases in keys_test.go.\n")
	for _, c := range cases {
		fmt.Fprintf(&b, "%s: root=%v keys=%v\n", c.name, c.ks.Root(), kvroute.BlockKeys(c.ks, c.bs, c.tokens, c.extras))
	}
	path := filepath.Join("testdata", "keys.golden")
	if *update {
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("read golden: %v (run with -update to create it)", err)
	}
	if got := b.String(); got != string(want) {
		t.Errorf("keys changed:\n got:\n%s\nwant:\n%s", got, want)
	}
}

func BenchmarkBlockKeys2048(b *testing.B) {
	r := rand.New(rand.NewPCG(5, 6))
	tokens := randTokens(r, 2048*bs)
	ks := kvroute.KeySpace{Model: "m"}
	b.SetBytes(int64(len(tokens) * 4))
	for b.Loop() {
		kvroute.BlockKeys(ks, bs, tokens, nil)
	}
}
