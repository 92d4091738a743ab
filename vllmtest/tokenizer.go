package vllmtest

import "strings"

// The built-in tokenizer, used when Config.Tokenizer is nil, is
// byte-level, so that token counts are easy to reason about in tests (one
// token per byte) and text prefixes give token prefixes: BOS is 1, EOS is
// 2 (never generated), and byte b is b+3, like the <0xNN> byte-fallback
// pieces of a sentencepiece vocabulary.
const (
	tokBOS    = 1
	tokEOS    = 2
	byteShift = 3
)

// encode turns text into token ids, with BOS first when addSpecial is set
// (vLLM's add_special_tokens, true by default for text prompts).
func encode(text string, addSpecial bool) []int {
	ids := make([]int, 0, len(text)+1)
	if addSpecial {
		ids = append(ids, tokBOS)
	}
	for i := 0; i < len(text); i++ {
		ids = append(ids, int(text[i])+byteShift)
	}
	return ids
}

// decode renders ids back to text; special and unknown ids render as nothing.
func decode(ids []int) string {
	var b strings.Builder
	for _, id := range ids {
		if c := id - byteShift; c >= 0 && c < 256 {
			b.WriteByte(byte(c))
		}
	}
	return b.String()
}

// Tokenize returns the ids a completion whose prompt is text uses (special
// tokens added, BOS for the byte tokenizer), exactly what POST /tokenize
// answers for {"prompt": text}. It returns nil when a Config.Tokenizer
// fails on text.
func (r *Replica) Tokenize(text string) []int {
	ids, err := r.encodeText(text, true)
	if err != nil {
		return nil
	}
	return ids
}

// chatMessage is one OpenAI chat message; content may be a string or a list
// of parts, of which only text parts count.
type chatMessage struct {
	Role    string `json:"role"`
	Content any    `json:"content"`
}

func (m chatMessage) text() string {
	switch c := m.Content.(type) {
	case string:
		return c
	case []any:
		var b strings.Builder
		for _, p := range c {
			if part, ok := p.(map[string]any); ok {
				if t, ok := part["text"].(string); ok {
					b.WriteString(t)
				}
			}
		}
		return b.String()
	}
	return ""
}

// renderChat is the replica's fixed ChatML-like template:
// "<|im_start|>ROLE\nCONTENT<|im_end|>\n" per message, then
// "<|im_start|>assistant\n" when addGenerationPrompt. With
// continueFinal the last message is left open instead. The template
// carries BOS as a special token, as real templates do, so chat tokens are
// [BOS] + bytes(rendered) and add_special_tokens=true adds a second BOS,
// the very mistake vLLM users make.
func renderChat(msgs []chatMessage, addGenerationPrompt, continueFinal bool) string {
	var b strings.Builder
	for i, m := range msgs {
		b.WriteString("<|im_start|>" + m.Role + "\n" + m.text())
		if continueFinal && i == len(msgs)-1 {
			return b.String()
		}
		b.WriteString("<|im_end|>\n")
	}
	if addGenerationPrompt {
		b.WriteString("<|im_start|>assistant\n")
	}
	return b.String()
}

func chatTokens(msgs []chatMessage, addGenerationPrompt, continueFinal, addSpecial bool) []int {
	ids := append([]int{tokBOS}, encode(renderChat(msgs, addGenerationPrompt, continueFinal), false)...)
	if addSpecial {
		ids = append([]int{tokBOS}, ids...)
	}
	return ids
}

// filler is what the replica "generates": a fixed phrase, cycled.
const filler = " the quick brown fox jumps over the lazy dog."

func generated(n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = int(filler[i%len(filler)]) + byteShift
	}
	return ids
}
