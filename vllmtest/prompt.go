package vllmtest

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/kvroute/kvroute/tokenizer"
	"github.com/kvroute/kvroute/tokenizer/template"
)

// Encoder turns text into token ids as the served model's tokenizer does.
// It is declared here, by its consumer, so that the replica depends on no
// particular tokenizer; *tokenizer.Tokenizer and *tokenizer.Cache are
// Encoders.
type Encoder interface {
	// Encode tokenizes text, with special tokens when addSpecialTokens is
	// set, as vLLM's /tokenize does.
	Encode(text string, addSpecialTokens bool) ([]uint32, error)
}

// ChatRenderer renders a chat request to the prompt text the engine
// tokenizes, as vLLM applies the model's chat template;
// *template.Template is a ChatRenderer.
type ChatRenderer interface {
	// Render applies the chat template to a chat request.
	Render(req template.Request) (template.Result, error)
}

var (
	_ Encoder      = (*tokenizer.Tokenizer)(nil)
	_ Encoder      = (*tokenizer.Cache)(nil)
	_ ChatRenderer = (*template.Template)(nil)
)

// promptTokens tokenizes the request exactly as /tokenize does: a text
// prompt with add_special_tokens defaulting to true, a chat with it
// defaulting to false (the template writes any BOS itself), as in vLLM.
func (r *Replica) promptTokens(g *genRequest, chat bool) ([]int, error) {
	var ids []int
	var err error
	if chat {
		ids, err = r.chatTokens(g, boolOr(g.AddSpecialTokens, false))
	} else {
		ids, err = r.parsePrompt(g.Prompt, boolOr(g.AddSpecialTokens, true))
	}
	if err != nil {
		return nil, err
	}
	if len(ids) > r.cfg.MaxModelLen {
		return nil, badRequest("This model's maximum context length is %d tokens. However, your request has %d input tokens.", r.cfg.MaxModelLen, len(ids))
	}
	return ids, nil
}

// encodeText tokenizes text with the configured tokenizer, or the byte
// tokenizer when there is none.
func (r *Replica) encodeText(text string, addSpecial bool) ([]int, error) {
	if r.cfg.Tokenizer == nil {
		return encode(text, addSpecial), nil
	}
	ids, err := r.cfg.Tokenizer.Encode(text, addSpecial)
	if errors.Is(err, tokenizer.ErrInvalidUTF8) {
		return nil, badRequest("%v", err)
	}
	if err != nil {
		return nil, fmt.Errorf("tokenize: %w", err)
	}
	out := make([]int, len(ids))
	for i, id := range ids {
		out[i] = int(id)
	}
	return out, nil
}

// chatTokens renders and tokenizes a chat. With a ChatRenderer the
// messages and their options reach the template as sent, and a request
// the template refuses is the client's 400 with the template's own words,
// as vLLM answers it. Without one the toy format is used: tokenized by the
// byte tokenizer it carries its own BOS (see chatTokens in tokenizer.go);
// by a configured tokenizer it is plain text.
func (r *Replica) chatTokens(g *genRequest, addSpecial bool) ([]int, error) {
	if !present(g.Messages) {
		return nil, badRequest("messages is required")
	}
	if r.cfg.ChatTemplate == nil {
		var msgs []chatMessage
		if err := json.Unmarshal(g.Messages, &msgs); err != nil {
			return nil, badRequest("messages must be an array of chat messages: %v", err)
		}
		if len(msgs) == 0 {
			return nil, badRequest("messages is required")
		}
		addGen := boolOr(g.AddGenerationPrompt, true)
		if r.cfg.Tokenizer == nil {
			return chatTokens(msgs, addGen, g.ContinueFinalMessage, addSpecial), nil
		}
		return r.encodeText(renderChat(msgs, addGen, g.ContinueFinalMessage), addSpecial)
	}
	res, err := r.cfg.ChatTemplate.Render(template.Request{
		Messages: g.Messages, Tools: g.Tools, Documents: g.Documents,
		AddGenerationPrompt: g.AddGenerationPrompt, ContinueFinalMessage: g.ContinueFinalMessage,
		ReasoningEffort: g.ReasoningEffort, Kwargs: g.ChatTemplateKwargs,
	})
	var re *template.RequestError
	switch {
	case errors.As(err, &re):
		return nil, badRequest("%s", re.Msg)
	case err != nil:
		// The template engine could not render what vLLM might accept:
		// the simulator's failure, not the client's.
		return nil, fmt.Errorf("chat template: %w", err)
	}
	// The whole prompt is tokenized, media placeholders included: the
	// simulator has no multimodal processor to expand them.
	return r.encodeText(res.Prompt, addSpecial)
}

// present reports whether a JSON field was sent with a non-null value.
func present(raw json.RawMessage) bool { return len(raw) > 0 && string(raw) != "null" }

// parsePrompt accepts a string, an array of token ids, or a one-element
// array of either; several prompts in one request are not simulated.
func (r *Replica) parsePrompt(raw json.RawMessage, addSpecial bool) ([]int, error) {
	if !present(raw) {
		return nil, badRequest("prompt is required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return r.encodeText(s, addSpecial)
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err == nil {
		for _, id := range ids {
			if id < 0 {
				return nil, badRequest("token id %d is negative", id)
			}
		}
		return ids, nil
	}
	var many []json.RawMessage
	if err := json.Unmarshal(raw, &many); err == nil && len(many) == 1 {
		return r.parsePrompt(many[0], addSpecial)
	}
	return nil, badRequest("prompt must be a string, an array of token ids, or one of either")
}

func boolOr(b *bool, def bool) bool {
	if b == nil {
		return def
	}
	return *b
}

// parseGenerate checks a completion or chat request as the generation
// endpoints do and returns what running it needs: the adapter, the
// prompt's token ids and the number of tokens to generate. The render
// endpoints share it, so that they refuse exactly what generation refuses.
func (r *Replica) parseGenerate(g *genRequest, chat bool) (lora string, prompt []int, maxTokens int, err error) {
	if lora, err = r.lora(g.Model); err != nil {
		return "", nil, 0, err
	}
	if prompt, err = r.promptTokens(g, chat); err != nil {
		return "", nil, 0, err
	}
	if len(prompt) == 0 {
		// vLLM's input processor refuses it: there is no last token to
		// sample from.
		return "", nil, 0, badRequest("The decoder prompt cannot be empty")
	}
	maxTokens = 16
	if g.MaxCompletionTokens != nil {
		maxTokens = *g.MaxCompletionTokens
	} else if g.MaxTokens != nil {
		maxTokens = *g.MaxTokens
	}
	if maxTokens < 0 {
		return "", nil, 0, badRequest("max_tokens must be at least 0, got %d", maxTokens)
	}
	return lora, prompt, maxTokens, nil
}

// serveTokenize answers POST /tokenize in vLLM's shape; the request is the
// chat form when it has messages, the prompt form otherwise.
func (r *Replica) serveTokenize(w http.ResponseWriter, req *http.Request) {
	var g genRequest
	if err := json.NewDecoder(req.Body).Decode(&g); err != nil {
		writeError(w, badRequest("invalid JSON: %v", err))
		return
	}
	if _, err := r.lora(g.Model); err != nil {
		writeError(w, err)
		return
	}
	ids, err := r.promptTokens(&g, present(g.Messages))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{
		"count": len(ids), "max_model_len": r.cfg.MaxModelLen, "tokens": ids, "token_strs": nil,
	})
}

// serveRender answers vLLM's POST /v1/completions/render and
// /v1/chat/completions/render: the body of a completion or chat request,
// answered with the engine token ids its prompt becomes, so that a router
// learns them from the same code path generation takes.
func (r *Replica) serveRender(w http.ResponseWriter, req *http.Request, chat bool) {
	var g genRequest
	if err := json.NewDecoder(req.Body).Decode(&g); err != nil {
		writeError(w, badRequest("invalid JSON: %v", err))
		return
	}
	_, prompt, _, err := r.parseGenerate(&g, chat)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"token_ids": prompt})
}
