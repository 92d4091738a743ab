package tokenizer

// ScannerPatterns lists the patterns with a hand-written scanner.
func ScannerPatterns() []string { return []string{llama3Pattern, qwen2Pattern} }

// CompareScanner returns the matches of pattern in s from its scanner and
// from regexp2.
func CompareScanner(pattern, s string) (fast, slow [][2]int, err error) {
	re, err := compileSplitRegex(pattern)
	if err != nil {
		return nil, nil, err
	}
	return re.scan(s, nil), re.findAllRegexp2(s), nil
}
