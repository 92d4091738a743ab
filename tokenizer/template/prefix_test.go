package template_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/testfiles"
	"github.com/kvroute/kvroute/tokenizer/template"
)

const (
	// openaiTemplate loops over content parts, so vLLM keeps them as dicts.
	openaiTemplate = "{% for m in messages %}<{{ m.role }}>{% for c in m.content %}{% if c.type == 'image' %}[IMG]{% else %}{{ c.text }}{% endif %}{% endfor %}</{{ m.role }}>{% endfor %}"
	// stringTemplate prints content as one string.
	stringTemplate = "{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
)

func TestTextPrefix(t *testing.T) {
	image := `{"type":"image_url","image_url":{"url":"https://x/cat.png"}}`
	for _, tc := range []struct {
		name, src, msgs string
		wantPrompt      string
		wantPrefix      string
	}{
		{
			name:       "openai format, image in first message",
			src:        openaiTemplate,
			msgs:       `[{"role":"user","content":[{"type":"text","text":"see "},` + image + `]}]`,
			wantPrompt: "<user>see [IMG]</user>",
			wantPrefix: "<user>",
		},
		{
			name:       "openai format, image in a later turn",
			src:        openaiTemplate,
			msgs:       `[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":[` + image + `,"what?"]}]`,
			wantPrompt: "<user>hi</user><assistant>hello</assistant><user>[IMG]what?</user>",
			wantPrefix: "<user>hi</user><assistant>hello</assistant><user>",
		},
		{
			name:       "string format: the text parts render, the prefix stops at the message",
			src:        stringTemplate,
			msgs:       `[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},` + image + `]}]`,
			wantPrompt: "<system>s</system><user>a</user>",
			wantPrefix: "<system>s</system><user>",
		},
		{
			name:       "no media: the whole prompt",
			src:        stringTemplate,
			msgs:       `[{"role":"user","content":[{"type":"text","text":"a"}]}]`,
			wantPrompt: "<user>a</user>",
			wantPrefix: "<user>a</user>",
		},
		{
			name:       "earlier output depends on the content: nothing is certain",
			src:        "{% if messages[-1].content[0].type == 'image' %}IMAGE FIRST{% endif %}" + openaiTemplate,
			msgs:       `[{"role":"user","content":[` + image + `]}]`,
			wantPrompt: "IMAGE FIRST<user>[IMG]</user>",
			wantPrefix: "",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			res := mustRender(t, mustParse(t, tc.src), template.Request{Messages: json.RawMessage(tc.msgs), AddGenerationPrompt: new(bool)})
			if res.Prompt != tc.wantPrompt {
				t.Errorf("Prompt: got %q, want %q", res.Prompt, tc.wantPrompt)
			}
			if got := res.Prompt[:res.TextPrefix]; got != tc.wantPrefix {
				t.Errorf("Prompt[:TextPrefix]: got %q, want %q", got, tc.wantPrefix)
			}
		})
	}
}

// TestTextPrefixGemma3 checks the method on a real multimodal template:
// the certain prefix ends before Gemma 3's image token.
func TestTextPrefixGemma3(t *testing.T) {
	tmpl, err := template.Load(testfiles.Tokenizer(t, "gemma3"), template.Options{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := `[{"role":"system","content":"Be brief."},{"role":"user","content":[{"type":"text","text":"What is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]`
	res := mustRender(t, tmpl, template.Request{Messages: json.RawMessage(msgs)})
	image := strings.Index(res.Prompt, "<start_of_image>")
	if image < 0 {
		t.Fatalf("prompt %q has no image token", res.Prompt)
	}
	if want := "<bos><start_of_turn>user\nBe brief.\n\n"; res.Prompt[:res.TextPrefix] != want {
		t.Errorf("Prompt[:TextPrefix]: got %q, want %q", res.Prompt[:res.TextPrefix], want)
	}
}
