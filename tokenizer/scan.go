package tokenizer

// fastScanner returns a hand-written matcher for a pattern it knows, or
// nil. Filled in once the regexp2 path is proved against the goldens.
func fastScanner(pattern string) func(s string, dst [][2]int) [][2]int {
	return nil
}
