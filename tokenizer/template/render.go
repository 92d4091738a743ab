package template

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ardanlabs/jinja"
)

// Request is the part of an OpenAI chat-completion request that reaches
// the chat template, with vLLM's field names and defaults.
type Request struct {
	// Messages is the request's "messages" array, as sent.
	Messages json.RawMessage
	// Tools is the "tools" array; empty or null means none.
	Tools json.RawMessage
	// Documents is the "documents" array, for RAG templates; optional.
	Documents json.RawMessage
	// AddGenerationPrompt is "add_generation_prompt"; nil means vLLM's
	// default, true.
	AddGenerationPrompt *bool
	// ContinueFinalMessage is "continue_final_message": the prompt ends
	// inside the final message instead of after it.
	ContinueFinalMessage bool
	// ReasoningEffort is "reasoning_effort"; empty means unset.
	ReasoningEffort string
	// Kwargs is "chat_template_kwargs", an object whose keys become
	// template variables (enable_thinking, …).
	Kwargs json.RawMessage
}

// Result is a rendered prompt.
type Result struct {
	// Prompt is the text vLLM would tokenize. When the request has a
	// non-text content part it is exact only up to TextPrefix (see there).
	Prompt string
	// TextPrefix is the byte length of Prompt's leading part that is
	// certain to precede any non-text content: len(Prompt) when there is
	// none. See prefix.go for how it is found and where that can fall short.
	TextPrefix int
}

// RequestError is a request vLLM refuses too: the template raised (its
// message is Msg, verbatim), or the request breaks a rule vLLM or
// transformers enforces before rendering. The API answers it with 400, as
// vLLM does. Any other error from Render means this engine could not
// render a request vLLM might accept.
type RequestError struct {
	Msg string
}

func (e *RequestError) Error() string { return "template: " + e.Msg }

func requestErrorf(format string, args ...any) error {
	return &RequestError{Msg: fmt.Sprintf(format, args...)}
}

// continueTag is transformers' marker for continue_final_message: appended
// to the final message's text, found in the output, and cut off with
// everything after it.
const continueTag = "CONTINUE_FINAL_MESSAGE_TAG "

// Render renders req as vLLM would: messages normalised as vLLM's
// chat_utils does, then the template run in transformers' environment.
func (t *Template) Render(req Request) (Result, error) {
	addGen := req.AddGenerationPrompt == nil || *req.AddGenerationPrompt
	if req.ContinueFinalMessage && req.AddGenerationPrompt != nil && *req.AddGenerationPrompt {
		return Result{}, requestErrorf("Cannot set both `continue_final_message` and `add_generation_prompt` to True.")
	}
	tools, hasTools, err := normalizeTools(req.Tools)
	if err != nil {
		return Result{}, err
	}
	v := t.pick(hasTools)
	conv, err := normalizeMessages(req.Messages, v.openai)
	if err != nil {
		return Result{}, err
	}
	kw, err := normalizeKwargs(req.Kwargs)
	if err != nil {
		return Result{}, err
	}
	documents, _ := kw.get("documents")
	kw.del("documents")
	if len(req.Documents) > 0 && strings.TrimSpace(string(req.Documents)) != "null" {
		if documents, err = decodeJSON(req.Documents); err != nil {
			return Result{}, requestErrorf("documents: %v", err)
		}
	}
	if req.ReasoningEffort != "" && req.ReasoningEffort != "auto" {
		kw.set("reasoning_effort", req.ReasoningEffort)
	}
	if req.ContinueFinalMessage && addGen {
		return Result{}, requestErrorf("continue_final_message and add_generation_prompt are not compatible. " +
			"Use continue_final_message when you want the model to continue the final message, and " +
			"add_generation_prompt when you want to add a header that will prompt it to start a new " +
			"assistant message instead.")
	}
	r := &renderer{t: t, v: v, addGen: addGen, cont: req.ContinueFinalMessage}
	if r.vars, err = r.variables(kw, tools, hasTools, documents); err != nil {
		return Result{}, err
	}
	prompt, err := r.render(conv.messages)
	if err != nil {
		return Result{}, err
	}
	res := Result{Prompt: prompt, TextPrefix: len(prompt)}
	if conv.media >= 0 {
		res.TextPrefix = r.textPrefix(conv, prompt)
	}
	return res, nil
}

// renderer holds what one Render shares between its renders (the prompt
// and, for multimodal requests, the sentinel renders).
type renderer struct {
	t      *Template
	v      *variant
	addGen bool
	cont   bool
	vars   map[string]jinja.Value
}

// variables builds the template's globals the way transformers does:
// render(messages=…, tools=…, documents=…, add_generation_prompt=…,
// **special_tokens_map, **chat_template_kwargs), beside its
// raise_exception and strftime_now.
func (r *renderer) variables(kw *object, tools []any, hasTools bool, documents any) (map[string]jinja.Value, error) {
	vars := map[string]jinja.Value{
		"raise_exception": jinja.NewCallable("raise_exception", raiseException),
		"strftime_now":    jinja.NewCallable("strftime_now", r.strftimeNow),
	}
	for k, v := range r.t.specials {
		vars[k] = v
	}
	for _, k := range kw.keys {
		val, err := toValue(kw.vals[k])
		if err != nil {
			return nil, requestErrorf("chat_template_kwargs: %v", err)
		}
		vars[k] = val
	}
	toolsVal := jinja.None()
	if hasTools {
		var err error
		if toolsVal, err = toValue(tools); err != nil {
			return nil, requestErrorf("tools: %v", err)
		}
	}
	vars["tools"] = toolsVal
	docs, err := toValue(documents)
	if err != nil {
		return nil, requestErrorf("documents: %v", err)
	}
	vars["documents"] = docs
	vars["add_generation_prompt"] = jinja.NewBool(r.addGen)
	return vars, nil
}

// raisedError carries raise_exception's message through the engine.
type raisedError struct{ msg string }

func (e *raisedError) Error() string { return e.msg }

func raiseException(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	msg := ""
	if len(args) > 0 {
		msg = pyStr(args[0])
	} else if m, ok := kwargs["message"]; ok {
		msg = pyStr(m)
	}
	return jinja.Undefined(), &raisedError{msg: msg}
}

func (r *renderer) strftimeNow(args []jinja.Value, kwargs map[string]jinja.Value) (jinja.Value, error) {
	if len(args) == 0 {
		return jinja.Undefined(), errors.New("strftime_now() missing 1 required positional argument: 'format'")
	}
	return jinja.NewString(strftime(pyStr(args[0]), r.t.now())), nil
}

// pyStr is Python's str() of a value: strings as they are, others as
// their Python repr.
func pyStr(v jinja.Value) string {
	if v.IsString() {
		return v.AsString()
	}
	return v.String()
}

// render runs the template over messages, applying continue_final_message.
func (r *renderer) render(messages []any) (string, error) {
	var final string
	if r.cont {
		var err error
		if messages, final, err = markFinalMessage(messages, r.v.src); err != nil {
			return "", err
		}
	}
	msgs, err := toValue(messages)
	if err != nil {
		return "", requestErrorf("messages: %v", err)
	}
	vars := make(map[string]jinja.Value, len(r.vars)+1)
	for k, v := range r.vars {
		vars[k] = v
	}
	vars["messages"] = msgs
	out, err := r.v.compiled.RenderValues(vars)
	if err != nil {
		var raised *raisedError
		if errors.As(err, &raised) {
			return "", &RequestError{Msg: raised.msg}
		}
		return "", fmt.Errorf("template: render: %w", err)
	}
	if r.cont {
		return cutAtFinalMessage(out, final)
	}
	return out, nil
}

// markFinalMessage copies the conversation and appends continueTag to the
// final message's text (its last text part, for a list), as transformers'
// render_jinja_template does; it returns the text before the tag.
func markFinalMessage(messages []any, src string) ([]any, string, error) {
	if len(messages) == 0 {
		return nil, "", requestErrorf("continue_final_message is set but there are no messages")
	}
	messages = deepCopy(messages).([]any)
	last := messages[len(messages)-1].(*object)
	content, _ := last.get("content")
	if content == nil {
		return nil, "", requestErrorf(`continue_final_message is set but the final message has no "content" to continue!`)
	}
	if !strings.Contains(src, "content") {
		return nil, "", requestErrorf(`continue_final_message is set to "content" but this is not an accepted field in the chat_template`)
	}
	switch c := content.(type) {
	case string:
		last.set("content", c+continueTag)
		return messages, c, nil
	case []any:
		for i := len(c) - 1; i >= 0; i-- {
			part, ok := c[i].(*object)
			if !ok {
				continue
			}
			if text, ok := part.get("text"); ok {
				s, _ := text.(string)
				part.set("text", s+continueTag)
				return messages, s, nil
			}
		}
	}
	return nil, "", requestErrorf("continue_final_message is set but we could not find any text to continue in the final message!")
}

// cutAtFinalMessage ends the prompt where the final message's text ends.
func cutAtFinalMessage(out, final string) (string, error) {
	tag := strings.TrimSpace(continueTag)
	if !strings.Contains(out, strings.TrimFunc(final, isPySpace)) || !strings.Contains(out, tag) {
		return "", requestErrorf("continue_final_message is set but the final message does not appear in the chat after applying the chat template!")
	}
	loc := strings.LastIndex(out, tag)
	if strings.HasPrefix(out[loc:], continueTag) {
		return out[:loc], nil
	}
	// The template trimmed the tag's trailing space, so it trims the
	// message end too: cut the same way.
	return strings.TrimRightFunc(out[:loc], isPySpace), nil
}

// isPySpace is Python's str.isspace for one character, which rstrip uses.
func isPySpace(r rune) bool {
	switch r {
	case ' ', '\t', '\n', '\r', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x1f, 0x85, 0xa0,
		0x1680, 0x2028, 0x2029, 0x202f, 0x205f, 0x3000:
		return true
	}
	return r >= 0x2000 && r <= 0x200a
}
