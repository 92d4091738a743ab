package tokenizer

import (
	"fmt"

	"github.com/dlclark/regexp2/v2"
)

// splitRegex finds the matches of a pre-tokenizer or normalizer pattern
// as UTF-8 byte offsets. Hugging Face compiles these with Oniguruma;
// regexp2 is the Go engine with the same backtracking semantics,
// lookahead and \p{…} classes. The common byte-level patterns also have a
// hand-written scanner (scan.go), which is much faster and proved equal
// to regexp2 by the tests.
type splitRegex struct {
	re   *regexp2.Regexp
	scan func(s string, dst [][2]int) [][2]int // nil when no fast path
}

func compileSplitRegex(pattern string) (*splitRegex, error) {
	re, err := regexp2.Compile(pattern, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w", pattern, err)
	}
	return &splitRegex{re: re, scan: fastScanner(pattern)}, nil
}

// findAll returns the [start, end) byte offsets of every non-empty match,
// left to right. Empty matches are dropped: Hugging Face drops the empty
// pieces they would produce.
func (r *splitRegex) findAll(s string) [][2]int {
	if r.scan != nil {
		return r.scan(s, nil)
	}
	return r.findAllRegexp2(s)
}

// findAllRegexp2 is findAll through regexp2 alone, the reference the fast
// scanners are tested against.
func (r *splitRegex) findAllRegexp2(s string) [][2]int {
	if s == "" {
		return nil
	}
	idx, err := r.re.FindAllStringIndex(s, -1)
	if err != nil {
		// regexp2 errors only on a timeout, and none is set.
		panic(fmt.Sprintf("tokenizer: regex %q: %v", r.re.String(), err))
	}
	out := make([][2]int, 0, len(idx))
	for _, m := range idx {
		if m[1] > m[0] {
			out = append(out, [2]int{m[0], m[1]})
		}
	}
	return out
}
