package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"slices"
	"time"

	"github.com/ardanlabs/jinja"
)

// Options configures a Template.
type Options struct {
	// Now is the clock strftime_now reads (templates such as Llama 3.1's
	// print today's date). Nil means time.Now; tests pin it so that
	// rendered prompts are reproducible.
	Now func() time.Time

	// ChatTemplate, when set, replaces the model's own template, as vLLM's
	// --chat-template does. The tokenizer_config.json special tokens still
	// apply.
	ChatTemplate string
}

// Template is a model's chat template, parsed once and safe for
// concurrent use: Render never mutates it.
type Template struct {
	// def is used when the request carries no tools (or the model has only
	// one template); tool is the "tool_use" template of a named list, used
	// when tools are given, as transformers chooses.
	def, tool *variant
	specials  map[string]jinja.Value
	now       func() time.Time
}

// variant is one template source with what is derived from it once.
type variant struct {
	src      string
	compiled *jinja.Template
	// openai records vLLM's content-format detection: true when the
	// template loops over a message's content, so content stays a list of
	// parts; false when parts are joined into one string.
	openai bool
}

// ErrNoTemplate is Load's answer for a model folder that defines no chat
// template (base models, gpt-oss's and Llama 2's packages): its chats
// cannot be rendered here.
var ErrNoTemplate = errors.New("template: load: the model defines no chat template")

// Load reads a model folder the way transformers does: tokenizer_config.json
// for special tokens and its chat_template (a string, or a list of
// {name, template}), overridden by a chat_template.jinja file beside it.
func Load(dir string, opt Options) (*Template, error) {
	return LoadFS(os.DirFS(dir), ".", opt)
}

// LoadFS is Load over a file system, for tokenizer files embedded in the
// binary.
func LoadFS(fsys fs.FS, dir string, opt Options) (*Template, error) {
	raw, err := fs.ReadFile(fsys, path.Join(dir, "tokenizer_config.json"))
	if err != nil {
		return nil, fmt.Errorf("template: load: %w", err)
	}
	var cfg map[string]json.RawMessage
	if err := json.Unmarshal(raw, &cfg); err != nil {
		return nil, fmt.Errorf("template: load: tokenizer_config.json: %w", err)
	}
	specials, err := specialTokens(cfg)
	if err != nil {
		return nil, fmt.Errorf("template: load: %w", err)
	}
	def, tool, err := configTemplates(cfg["chat_template"])
	if err != nil {
		return nil, fmt.Errorf("template: load: chat_template: %w", err)
	}
	jinjaFile, err := fs.ReadFile(fsys, path.Join(dir, "chat_template.jinja"))
	switch {
	case err == nil:
		def, tool = string(jinjaFile), ""
	case !errors.Is(err, fs.ErrNotExist):
		return nil, fmt.Errorf("template: load: %w", err)
	}
	if opt.ChatTemplate != "" {
		def, tool = opt.ChatTemplate, ""
	}
	if def == "" {
		return nil, ErrNoTemplate
	}
	return build(def, tool, specials, opt)
}

// Parse builds a Template from a template source and its special tokens
// (bos_token, eos_token, …), for callers that hold them already.
func Parse(src string, specials map[string]string, opt Options) (*Template, error) {
	vals := make(map[string]jinja.Value, len(specials))
	for k, v := range specials {
		vals[k] = jinja.NewString(v)
	}
	if opt.ChatTemplate != "" {
		src = opt.ChatTemplate
	}
	return build(src, "", vals, opt)
}

func build(def, tool string, specials map[string]jinja.Value, opt Options) (*Template, error) {
	t := &Template{specials: specials, now: opt.Now}
	if t.now == nil {
		t.now = time.Now
	}
	var err error
	if t.def, err = newVariant(def); err != nil {
		return nil, err
	}
	if tool != "" {
		if t.tool, err = newVariant(tool); err != nil {
			return nil, err
		}
	}
	return t, nil
}

func newVariant(src string) (*variant, error) {
	compiled, err := jinja.Compile(src)
	if err != nil {
		return nil, fmt.Errorf("template: parse: %w", err)
	}
	return &variant{src: src, compiled: compiled, openai: detectOpenAIFormat(src)}, nil
}

// pick returns the template transformers' get_chat_template would use:
// "tool_use" when tools are given (even an empty list) and it exists.
func (t *Template) pick(hasTools bool) *variant {
	if hasTools && t.tool != nil {
		return t.tool
	}
	return t.def
}

// configTemplates reads tokenizer_config.json's chat_template: a string, or
// a list of named templates of which "default" and "tool_use" matter.
func configTemplates(raw json.RawMessage) (def, tool string, err error) {
	if len(raw) == 0 || string(raw) == "null" {
		return "", "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, "", nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", "", err
	}
	for _, n := range named {
		switch n.Name {
		case "default":
			def = n.Template
		case "tool_use":
			tool = n.Template
		}
	}
	if def == "" {
		if tool == "" {
			return "", "", errors.New("multiple chat templates with no default specified")
		}
		// transformers errors without tools when there is no default; a
		// tool_use-only list still renders requests that carry tools.
		def = tool
	}
	return def, tool, nil
}

// specialAttrs are transformers' SPECIAL_TOKENS_ATTRIBUTES; the keys of
// extra_special_tokens join them per model, as in transformers 4.x.
var specialAttrs = []string{
	"bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
	"cls_token", "mask_token", "additional_special_tokens",
}

// specialTokens builds the template variables transformers' special_tokens_map
// supplies: each set token as its string (an AddedToken dict gives its
// "content"), additional_special_tokens as a list. Unset or empty ones are
// left undefined, as special_tokens_map leaves them out.
func specialTokens(cfg map[string]json.RawMessage) (map[string]jinja.Value, error) {
	extra := map[string]json.RawMessage{}
	if raw, ok := cfg["extra_special_tokens"]; ok {
		// A list form exists in some configs; only the dict form names tokens.
		_ = json.Unmarshal(raw, &extra)
	}
	attrs := append([]string(nil), specialAttrs...)
	for k := range extra {
		if !slices.Contains(attrs, k) {
			attrs = append(attrs, k)
		}
	}
	out := map[string]jinja.Value{}
	for _, attr := range attrs {
		raw, ok := cfg[attr]
		if !ok {
			raw, ok = extra[attr]
		}
		if !ok {
			continue
		}
		if attr == "additional_special_tokens" {
			var list []json.RawMessage
			if err := json.Unmarshal(raw, &list); err != nil || len(list) == 0 {
				continue
			}
			items := make([]jinja.Value, 0, len(list))
			for _, item := range list {
				s, err := tokenContent(item)
				if err != nil {
					return nil, fmt.Errorf("%s: %w", attr, err)
				}
				items = append(items, jinja.NewString(s))
			}
			out[attr] = jinja.NewList(items)
			continue
		}
		s, err := tokenContent(raw)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", attr, err)
		}
		if s != "" {
			out[attr] = jinja.NewString(s)
		}
	}
	return out, nil
}

// tokenContent reads a token given as a string, an AddedToken dict, or null.
func tokenContent(raw json.RawMessage) (string, error) {
	if string(raw) == "null" {
		return "", nil
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var added struct {
		Content string `json:"content"`
	}
	if err := json.Unmarshal(raw, &added); err != nil {
		return "", err
	}
	return added.Content, nil
}
