package template

import (
	"encoding/json"
	"fmt"
	"strings"
)

// This file reproduces what vLLM does to a chat request before the template
// sees it (vllm/entrypoints/chat_utils.py, _parse_chat_message_content and
// _postprocess_messages; tools as ChatCompletionToolsParam.model_dump()).
// Each message is rebuilt with vLLM's keys in vLLM's order, so a template
// that prints a message (or tests `'tool_calls' in message`) sees what it
// sees under vLLM.

// textPartField names the field holding the text of each text-like part
// type (MM_PARSER_MAP's text entries).
var textPartField = map[string]string{
	"text":        "text",
	"input_text":  "text",
	"output_text": "text",
	"refusal":     "refusal",
	"thinking":    "thinking",
}

// mediaModality maps a media part type to the modality vLLM's openai
// format renders it as ({"type": "image"}, …).
var mediaModality = map[string]string{
	"image_url":    "image",
	"input_image":  "image",
	"image_embeds": "image",
	"image_pil":    "image",
	"audio_url":    "audio",
	"input_audio":  "audio",
	"audio_embeds": "audio",
	"video_url":    "video",
	"video_embeds": "video",
}

// untypedMediaKeys are the keys vLLM accepts in place of a "type", in the
// order it tries them.
var untypedMediaKeys = []string{"image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds", "audio_url", "input_audio", "video_url", "tool_reference"}

// conversation is a request after vLLM's normalisation.
type conversation struct {
	messages []any // each an *object
	// media is the index of the first message with a non-text part, or -1.
	media int
}

// normalizeMessages decodes and normalises the request's messages. openai
// selects vLLM's "openai" content format (parts stay a list of dicts)
// over "string" (text parts joined with "\n").
func normalizeMessages(raw json.RawMessage, openai bool) (conversation, error) {
	conv := conversation{media: -1}
	if len(raw) == 0 {
		return conv, requestErrorf("messages: required")
	}
	tree, err := decodeJSON(raw)
	if err != nil {
		return conv, requestErrorf("messages: %v", err)
	}
	list, ok := tree.([]any)
	if !ok {
		return conv, requestErrorf("messages: not a list")
	}
	for i, item := range list {
		msg, ok := item.(*object)
		if !ok {
			return conv, requestErrorf("messages[%d]: not an object", i)
		}
		out, media, err := normalizeMessage(msg, openai)
		if err != nil {
			return conv, requestErrorf("messages[%d]: %v", i, err)
		}
		if media && conv.media < 0 {
			conv.media = i
		}
		conv.messages = append(conv.messages, out)
	}
	if err := parseToolCallArguments(conv.messages); err != nil {
		return conv, err
	}
	return conv, nil
}

// normalizeMessage rebuilds one message; media reports a non-text part.
func normalizeMessage(msg *object, openai bool) (*object, bool, error) {
	roleV, _ := msg.get("role")
	role, ok := roleV.(string)
	if !ok {
		return nil, false, fmt.Errorf("role: not a string")
	}
	var parts []any
	switch c, _ := msg.get("content"); c := c.(type) {
	case nil:
	case string:
		parts = []any{textPart(c)}
	case []any:
		parts = c
	default:
		return nil, false, fmt.Errorf("content: neither a string nor a list of parts")
	}
	var texts []string
	var wrapped []any
	media := false
	for _, p := range parts {
		text, isText, modality, err := classifyPart(p)
		if err != nil {
			return nil, false, err
		}
		switch {
		case isText && text == nil:
			// A text part without text is skipped, as vLLM does.
		case isText:
			texts = append(texts, *text)
			wrapped = append(wrapped, textPart(*text))
		case modality == "tool_reference":
			name, _ := p.(*object).get("name")
			s, _ := name.(string)
			texts = append(texts, s)
			ref := newObject()
			ref.set("type", "tool_reference")
			ref.set("name", s)
			wrapped = append(wrapped, ref)
		default:
			media = true
			// The string format's placeholder is the model's own
			// (<start_of_image>, …), unknown here: only the text around it is
			// rendered, and TextPrefix stops before this message.
			m := newObject()
			m.set("type", modality)
			wrapped = append(wrapped, m)
		}
	}
	out := newObject()
	out.set("role", role)
	if openai {
		if wrapped == nil {
			wrapped = []any{}
		}
		out.set("content", wrapped)
	} else {
		out.set("content", strings.Join(texts, "\n"))
	}
	switch role {
	case "assistant":
		if calls, ok := msg.get("tool_calls"); ok && calls != nil {
			out.set("tool_calls", deepCopy(calls))
		}
		if r, ok := msg.get("reasoning"); ok && r != nil {
			out.set("reasoning", r)
			out.set("reasoning_content", r)
		}
	case "tool":
		if id, ok := msg.get("tool_call_id"); ok {
			out.set("tool_call_id", id)
		}
		// Tool results given as text parts become one string even in the
		// openai format; a list with other parts stays a list.
		if list, ok := out.vals["content"].([]any); ok && allText(list) {
			var ts []string
			for _, item := range list {
				text, _ := item.(*object).get("text")
				s, _ := text.(string)
				ts = append(ts, s)
			}
			out.set("content", strings.Join(ts, "\n"))
		}
	}
	if name, ok := msg.get("name"); ok {
		if s, ok := name.(string); ok {
			out.set("name", s)
		}
	}
	if task, ok := msg.get("task"); ok {
		if s, ok := task.(string); ok {
			out.set("task", s)
		}
	}
	if role == "developer" {
		tools, _ := msg.get("tools")
		out.set("tools", deepCopy(tools))
	}
	return out, media, nil
}

func textPart(s string) *object {
	o := newObject()
	o.set("type", "text")
	o.set("text", s)
	return o
}

func allText(list []any) bool {
	for _, item := range list {
		o, ok := item.(*object)
		if !ok {
			continue
		}
		if t, _ := o.get("type"); t != "text" {
			return false
		}
	}
	return true
}

// classifyPart reads one content part: its text for text-like parts (nil
// when the part carries none), else its modality ("image", "audio",
// "video", or "tool_reference").
func classifyPart(p any) (text *string, isText bool, modality string, err error) {
	if s, ok := p.(string); ok {
		return &s, true, "", nil
	}
	part, ok := p.(*object)
	if !ok {
		return nil, false, "", fmt.Errorf("content part: not an object")
	}
	typ, hasType := part.get("type")
	if !hasType || typ == nil {
		for _, k := range untypedMediaKeys {
			if _, ok := part.get(k); ok {
				typ = k
				break
			}
		}
		if typ == nil {
			return nil, false, "", fmt.Errorf("Missing 'type' field in multimodal part.")
		}
	}
	name, ok := typ.(string)
	if !ok {
		return nil, false, "", fmt.Errorf("Invalid 'type' field in multimodal part.")
	}
	if field, ok := textPartField[name]; ok {
		v, _ := part.get(field)
		switch v := v.(type) {
		case nil:
			return nil, true, "", nil
		case string:
			return &v, true, "", nil
		}
		return nil, false, "", fmt.Errorf("content part %q: %s is not a string", name, field)
	}
	if name == "tool_reference" {
		return nil, false, name, nil
	}
	if m, ok := mediaModality[name]; ok {
		return nil, false, m, nil
	}
	if name == "prompt_embeds" {
		return nil, false, "", fmt.Errorf("prompt_embeds content parts are not supported")
	}
	return nil, false, "", fmt.Errorf("Unsupported chat content part type: '%s'.", name)
}

// parseToolCallArguments applies vLLM's _postprocess_messages: an empty
// tool_calls list is dropped, and each call's function.arguments, when a
// string, is parsed as JSON ({} when it is not valid JSON); arguments that
// are neither an object, a list nor a string become {}.
func parseToolCallArguments(messages []any) error {
	for i, m := range messages {
		msg := m.(*object)
		if role, _ := msg.get("role"); role != "assistant" {
			continue
		}
		raw, ok := msg.get("tool_calls")
		if !ok {
			continue
		}
		calls, ok := raw.([]any)
		if !ok {
			continue
		}
		if len(calls) == 0 {
			msg.del("tool_calls")
			continue
		}
		for j, c := range calls {
			call, ok := c.(*object)
			var fn *object
			if ok {
				f, _ := call.get("function")
				fn, ok = f.(*object)
			}
			if !ok {
				return requestErrorf("messages[%d].tool_calls[%d]: no function object", i, j)
			}
			args, _ := fn.get("arguments")
			switch a := args.(type) {
			case string:
				parsed, err := decodeJSON([]byte(a))
				if err != nil {
					parsed = newObject()
				}
				fn.set("arguments", parsed)
			case *object, []any:
			default:
				fn.set("arguments", newObject())
			}
		}
	}
	return nil
}

// normalizeTools returns the tools as vLLM passes them to the template:
// each ChatCompletionToolsParam.model_dump(), so declared fields only, in
// declaration order, with description and parameters present (null) even
// when the client left them out. Nil raw means no tools (None); an empty
// list stays an empty list.
func normalizeTools(raw json.RawMessage) ([]any, bool, error) {
	if len(raw) == 0 || strings.TrimSpace(string(raw)) == "null" {
		return nil, false, nil
	}
	tree, err := decodeJSON(raw)
	if err != nil {
		return nil, false, requestErrorf("tools: %v", err)
	}
	list, ok := tree.([]any)
	if !ok {
		return nil, false, requestErrorf("tools: not a list")
	}
	out := make([]any, 0, len(list))
	for i, item := range list {
		tool, ok := item.(*object)
		if !ok {
			return nil, false, requestErrorf("tools[%d]: not an object", i)
		}
		dumped, err := dumpTool(tool)
		if err != nil {
			return nil, false, requestErrorf("tools[%d]: %v", i, err)
		}
		out = append(out, dumped)
	}
	return out, true, nil
}

func dumpTool(tool *object) (*object, error) {
	typ := any("function")
	if t, ok := tool.get("type"); ok {
		if t != "function" {
			return nil, fmt.Errorf("type must be \"function\"")
		}
		typ = t
	}
	f, _ := tool.get("function")
	fn, ok := f.(*object)
	if !ok {
		return nil, fmt.Errorf("function: required object")
	}
	name, _ := fn.get("name")
	if _, ok := name.(string); !ok {
		return nil, fmt.Errorf("function.name: required string")
	}
	outFn := newObject()
	outFn.set("name", name)
	for _, k := range []string{"description", "parameters"} {
		v, _ := fn.get(k)
		outFn.set(k, deepCopy(v))
	}
	if strict, _ := fn.get("strict"); strict != nil {
		outFn.set("strict", strict)
	}
	defer_, _ := tool.get("defer_loading")
	fnDefer, _ := fn.get("defer_loading")
	if fnDefer == nil {
		fnDefer = defer_
	}
	if fnDefer != nil {
		outFn.set("defer_loading", fnDefer)
	}
	out := newObject()
	out.set("type", typ)
	out.set("function", outFn)
	if defer_ != nil {
		out.set("defer_loading", defer_)
	}
	return out, nil
}

// consumedKwargs are apply_chat_template parameters that never reach the
// template; vLLM lets them through its kwargs filter and transformers
// takes them.
var consumedKwargs = []string{"padding", "truncation", "max_length", "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "add_generation_prompt", "continue_final_message"}

// normalizeKwargs decodes chat_template_kwargs. vLLM drops the keys its
// template does not read; passing them all renders the same, since a
// variable the template never reads cannot change its output. Keys that
// vLLM refuses, or that would collide with apply_chat_template's own
// arguments, are errors here as there.
func normalizeKwargs(raw json.RawMessage) (*object, error) {
	if len(raw) == 0 || strings.TrimSpace(string(raw)) == "null" {
		return newObject(), nil
	}
	tree, err := decodeJSON(raw)
	if err != nil {
		return nil, requestErrorf("chat_template_kwargs: %v", err)
	}
	kw, ok := tree.(*object)
	if !ok {
		return nil, requestErrorf("chat_template_kwargs: not an object")
	}
	var bad []string
	for _, k := range []string{"chat_template", "tokenize"} {
		if _, ok := kw.get(k); ok {
			bad = append(bad, "'"+k+"'")
		}
	}
	if len(bad) > 0 {
		return nil, requestErrorf("Found unexpected chat template kwargs from request: {%s}", strings.Join(bad, ", "))
	}
	for _, k := range []string{"conversation", "messages", "tools"} {
		if _, ok := kw.get(k); ok {
			return nil, requestErrorf("chat_template_kwargs: %q collides with apply_chat_template's own argument", k)
		}
	}
	for _, k := range consumedKwargs {
		kw.del(k)
	}
	return kw, nil
}
