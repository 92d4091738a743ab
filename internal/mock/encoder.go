package mock

// ByteEncoder is a tokenizer whose ids are easy to predict in a test: one
// id per byte (the byte + 3), and BOS (1) first when special tokens are
// asked for. It satisfies prompt.Encoder.
type ByteEncoder struct{}

// Encode tokenizes text; it never fails.
func (ByteEncoder) Encode(text string, addSpecialTokens bool) ([]uint32, error) {
	return ByteEncoder{}.IDs(text, addSpecialTokens), nil
}

// IDs is Encode without the error, for building expected values.
func (ByteEncoder) IDs(text string, addSpecialTokens bool) []uint32 {
	ids := make([]uint32, 0, len(text)+1)
	if addSpecialTokens {
		ids = append(ids, 1)
	}
	for i := range len(text) {
		ids = append(ids, uint32(text[i])+3)
	}
	return ids
}
