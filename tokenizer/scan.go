package tokenizer

import (
	"unicode"
	"unicode/utf8"
)

// Patterns with a hand-written scanner: the Llama 3 split (digits in runs
// of up to three) and Qwen2/Qwen3's (single digits). regexp2 decodes the
// input to runes and backtracks; a direct scan is several times faster.
// TestScannerEqualsRegexp2 and FuzzScanner prove the scanners equal to
// regexp2 on these patterns.
const (
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	qwen2Pattern  = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

// fastScanner returns a hand-written matcher for a pattern it knows, or nil.
func fastScanner(pattern string) func(s string, dst [][2]int) [][2]int {
	switch pattern {
	case llama3Pattern:
		return func(s string, dst [][2]int) [][2]int { return scanLlama3(s, dst, 3) }
	case qwen2Pattern:
		return func(s string, dst [][2]int) [][2]int { return scanLlama3(s, dst, 1) }
	}
	return nil
}

func isLetter(r rune) bool {
	return r < 0x80 && (r|0x20 >= 'a' && r|0x20 <= 'z') || r >= 0x80 && unicode.IsLetter(r)
}

func isNumber(r rune) bool {
	return r < 0x80 && r >= '0' && r <= '9' || r >= 0x80 && unicode.IsNumber(r)
}

func isSpace(r rune) bool { return unicode.IsSpace(r) }

// isOther is [^\s\p{L}\p{N}].
func isOther(r rune) bool { return !isSpace(r) && !isLetter(r) && !isNumber(r) }

func runeAt(s string, i int) (rune, int) {
	if i >= len(s) {
		return -1, 0
	}
	if c := s[i]; c < utf8.RuneSelf {
		return rune(c), 1
	}
	return utf8.DecodeRuneInString(s[i:])
}

// scanLlama3 matches the Llama 3 / Qwen split pattern, alternative by
// alternative in the pattern's order, with maxDigits the \p{N} run limit.
func scanLlama3(s string, dst [][2]int, maxDigits int) [][2]int {
	for i := 0; i < len(s); {
		end := matchLlama3(s, i, maxDigits)
		dst = append(dst, [2]int{i, end})
		i = end
	}
	return dst
}

// matchLlama3 returns the end of the match starting at i. Every character
// starts some match under this pattern (the last three alternatives and
// the letter, digit and other classes cover everything), so there is one.
func matchLlama3(s string, i, maxDigits int) int {
	c, n := runeAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if c == '\'' && i+1 < len(s) {
		a := s[i+1] | 0x20
		switch a {
		case 's', 't', 'm', 'd':
			return i + 2
		}
		if i+2 < len(s) {
			b := s[i+2] | 0x20
			if (a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l') {
				return i + 3
			}
		}
	}
	// [^\r\n\p{L}\p{N}]?\p{L}+
	j := i
	if !isLetter(c) && !isNumber(c) && c != '\r' && c != '\n' {
		j = i + n
	}
	if r, _ := runeAt(s, j); isLetter(r) {
		for j < len(s) {
			r, m := runeAt(s, j)
			if !isLetter(r) {
				break
			}
			j += m
		}
		return j
	}
	// \p{N}{1,maxDigits}
	if isNumber(c) {
		j = i
		for k := 0; k < maxDigits && j < len(s); k++ {
			r, m := runeAt(s, j)
			if !isNumber(r) {
				break
			}
			j += m
		}
		return j
	}
	// ' ?[^\s\p{L}\p{N}]+[\r\n]*'
	j = i
	if c == ' ' {
		j = i + 1
	}
	if r, _ := runeAt(s, j); r >= 0 && isOther(r) {
		for j < len(s) {
			r, m := runeAt(s, j)
			if !isOther(r) {
				break
			}
			j += m
		}
		for j < len(s) && (s[j] == '\r' || s[j] == '\n') {
			j++
		}
		return j
	}
	// The rest start with whitespace: find the run and its last newline.
	j = i
	lastNL, lastStart := -1, i
	for j < len(s) {
		r, m := runeAt(s, j)
		if !isSpace(r) {
			break
		}
		if r == '\r' || r == '\n' {
			lastNL = j
		}
		lastStart = j
		j += m
	}
	// \s*[\r\n]+
	if lastNL >= 0 {
		return lastNL + 1
	}
	// \s+(?!\S): all of a run at the end, else all but its last character.
	if j == len(s) || lastStart > i {
		if j == len(s) {
			return j
		}
		return lastStart
	}
	// \s+
	return j
}
