package tokenizer

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// decoder turns token strings back into text, one Hugging Face decoder's
// decode_chain step.
type decoder interface {
	decodeChain(tokens []string) []string
}

// byteLevelDec undoes the ByteLevel byte-to-character map over the
// joined tokens, then reads the bytes as UTF-8, lossily.
type byteLevelDec struct{}

var charBytes = func() map[rune]byte {
	m := make(map[rune]byte, 256)
	for b, r := range byteChars {
		m[r] = byte(b)
	}
	return m
}()

func (byteLevelDec) decodeChain(tokens []string) []string {
	var buf []byte
	for _, t := range tokens {
		start := len(buf)
		ok := true
		for _, r := range t {
			b, found := charBytes[r]
			if !found {
				ok = false
				break
			}
			buf = append(buf, b)
		}
		if !ok {
			buf = append(buf[:start], t...)
		}
	}
	return []string{strings.ToValidUTF8(string(buf), "\uFFFD")}
}

type replaceDec struct{ old, new string }

func (d replaceDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		out[i] = strings.ReplaceAll(t, d.old, d.new)
	}
	return out
}

// byteFallbackDec turns runs of "<0xXX>" tokens into the text their bytes
// spell, or one U+FFFD per byte when they are not valid UTF-8.
type byteFallbackDec struct{}

func (byteFallbackDec) decodeChain(tokens []string) []string {
	var out []string
	var pending []byte
	flush := func() {
		if len(pending) == 0 {
			return
		}
		if utf8.Valid(pending) {
			out = append(out, string(pending))
		} else {
			for range pending {
				out = append(out, "\uFFFD")
			}
		}
		pending = pending[:0]
	}
	for _, t := range tokens {
		if len(t) == 6 && strings.HasPrefix(t, "<0x") && t[5] == '>' {
			if b, err := strconv.ParseUint(t[3:5], 16, 8); err == nil {
				pending = append(pending, byte(b))
				continue
			}
		}
		flush()
		out = append(out, t)
	}
	flush()
	return out
}

type fuseDec struct{}

func (fuseDec) decodeChain(tokens []string) []string {
	return []string{strings.Join(tokens, "")}
}

// stripDec removes up to start copies of content from each token's left
// and up to stop from its right.
type stripDec struct {
	content     string
	start, stop int
}

func (d stripDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		for n := 0; n < d.start && strings.HasPrefix(t, d.content); n++ {
			t = t[len(d.content):]
		}
		for n := 0; n < d.stop && strings.HasSuffix(t, d.content); n++ {
			t = t[:len(t)-len(d.content)]
		}
		out[i] = t
	}
	return out
}

type metaspaceDec struct {
	rep     string
	prepend bool // prepend_scheme is not "never": drop the first leading space
}

func (d metaspaceDec) decodeChain(tokens []string) []string {
	out := make([]string, len(tokens))
	for i, t := range tokens {
		t = strings.ReplaceAll(t, d.rep, " ")
		if i == 0 && d.prepend {
			t = strings.TrimPrefix(t, " ")
		}
		out[i] = t
	}
	return out
}

type sequenceDec []decoder

func (s sequenceDec) decodeChain(tokens []string) []string {
	for _, d := range s {
		tokens = d.decodeChain(tokens)
	}
	return tokens
}

type decoderJSON struct {
	Type          string            `json:"type"`
	Decoders      []json.RawMessage `json:"decoders"`
	Pattern       patternJSON       `json:"pattern"`
	Content       string            `json:"content"`
	Start         int               `json:"start"`
	Stop          int               `json:"stop"`
	Replacement   string            `json:"replacement"`
	PrependScheme string            `json:"prepend_scheme"`
}

func parseDecoder(raw json.RawMessage) (decoder, error) {
	var j decoderJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	switch j.Type {
	case "ByteLevel":
		return byteLevelDec{}, nil
	case "ByteFallback":
		return byteFallbackDec{}, nil
	case "Fuse":
		return fuseDec{}, nil
	case "Strip":
		return stripDec{content: j.Content, start: j.Start, stop: j.Stop}, nil
	case "Replace":
		if j.Pattern.String == nil {
			return nil, fmt.Errorf("Replace: only string patterns are supported")
		}
		return replaceDec{old: *j.Pattern.String, new: j.Content}, nil
	case "Metaspace":
		rep := j.Replacement
		if rep == "" {
			rep = "▁"
		}
		return metaspaceDec{rep: rep, prepend: j.PrependScheme != "never"}, nil
	case "Sequence":
		var seq sequenceDec
		for i, r := range j.Decoders {
			d, err := parseDecoder(r)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			seq = append(seq, d)
		}
		return seq, nil
	}
	return nil, fmt.Errorf("decoder type %q is not supported", j.Type)
}
