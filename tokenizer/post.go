package tokenizer

import (
	"encoding/json"
	"fmt"
)

// postProcessor adds special tokens around an encoded single sequence.
// It only runs when Encode is asked to add special tokens.
type postProcessor interface {
	process(ids []uint32) []uint32
}

// templatePost is TemplateProcessing's "single" template: special tokens'
// ids and the sequence, in order.
type templatePost struct {
	items []templateItem
}

type templateItem struct {
	sequence bool     // the input sequence; otherwise ids
	ids      []uint32 // a special token's ids
}

func (t *templatePost) process(ids []uint32) []uint32 {
	n := len(ids)
	for _, it := range t.items {
		n += len(it.ids)
	}
	out := make([]uint32, 0, n)
	for _, it := range t.items {
		if it.sequence {
			out = append(out, ids...)
		} else {
			out = append(out, it.ids...)
		}
	}
	return out
}

// wrapPost is BertProcessing and RobertaProcessing for one sequence:
// cls, the sequence, sep.
type wrapPost struct{ cls, sep uint32 }

func (w wrapPost) process(ids []uint32) []uint32 {
	out := make([]uint32, 0, len(ids)+2)
	out = append(out, w.cls)
	out = append(out, ids...)
	return append(out, w.sep)
}

type sequencePost []postProcessor

func (s sequencePost) process(ids []uint32) []uint32 {
	for _, p := range s {
		ids = p.process(ids)
	}
	return ids
}

type postJSON struct {
	Type          string            `json:"type"`
	Processors    []json.RawMessage `json:"processors"`
	Single        []json.RawMessage `json:"single"`
	SpecialTokens map[string]struct {
		ID  string   `json:"id"`
		IDs []uint32 `json:"ids"`
	} `json:"special_tokens"`
	Sep []json.RawMessage `json:"sep"`
	Cls []json.RawMessage `json:"cls"`
}

// parsePostProcessor returns nil for a processor that leaves ids alone
// (ByteLevel only adjusts offsets).
func parsePostProcessor(raw json.RawMessage) (postProcessor, error) {
	var j postJSON
	if err := json.Unmarshal(raw, &j); err != nil {
		return nil, err
	}
	switch j.Type {
	case "ByteLevel":
		return nil, nil
	case "Sequence":
		var seq sequencePost
		for i, r := range j.Processors {
			p, err := parsePostProcessor(r)
			if err != nil {
				return nil, fmt.Errorf("Sequence[%d]: %w", i, err)
			}
			if p != nil {
				seq = append(seq, p)
			}
		}
		if len(seq) == 0 {
			return nil, nil
		}
		return seq, nil
	case "TemplateProcessing":
		t := &templatePost{}
		for i, r := range j.Single {
			var item struct {
				SpecialToken *struct {
					ID string `json:"id"`
				} `json:"SpecialToken"`
				Sequence *struct {
					ID string `json:"id"`
				} `json:"Sequence"`
			}
			if err := json.Unmarshal(r, &item); err != nil {
				return nil, fmt.Errorf("TemplateProcessing: single[%d]: %w", i, err)
			}
			switch {
			case item.Sequence != nil:
				if item.Sequence.ID != "A" {
					return nil, fmt.Errorf("TemplateProcessing: single[%d]: sequence %q in a single template", i, item.Sequence.ID)
				}
				t.items = append(t.items, templateItem{sequence: true})
			case item.SpecialToken != nil:
				st, ok := j.SpecialTokens[item.SpecialToken.ID]
				if !ok {
					return nil, fmt.Errorf("TemplateProcessing: special token %q is not in special_tokens", item.SpecialToken.ID)
				}
				t.items = append(t.items, templateItem{ids: st.IDs})
			default:
				return nil, fmt.Errorf("TemplateProcessing: single[%d]: unknown piece", i)
			}
		}
		return t, nil
	case "BertProcessing", "RobertaProcessing":
		cls, err := tokenPairID(j.Cls)
		if err != nil {
			return nil, fmt.Errorf("%s: cls: %w", j.Type, err)
		}
		sep, err := tokenPairID(j.Sep)
		if err != nil {
			return nil, fmt.Errorf("%s: sep: %w", j.Type, err)
		}
		return wrapPost{cls: cls, sep: sep}, nil
	}
	return nil, fmt.Errorf("post-processor type %q is not supported", j.Type)
}

// tokenPairID reads the id of a ["token", id] pair.
func tokenPairID(pair []json.RawMessage) (uint32, error) {
	if len(pair) != 2 {
		return 0, fmt.Errorf("want [token, id]")
	}
	var id uint32
	if err := json.Unmarshal(pair[1], &id); err != nil {
		return 0, err
	}
	return id, nil
}
