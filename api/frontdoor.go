package api

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/strictjson"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/router"
)

// Prompts turns a client's prompt (token ids, text or chat messages) into
// the token ids the engine will compute; *prompt.Resolver is one.
type Prompts interface {
	// Resolve returns the prompt's token ids, or a cache-blind result
	// saying why there are none; an error is the client's (a chat the
	// template refuses).
	Resolve(ctx context.Context, in prompt.Input) (prompt.Result, error)
	// Local reports whether model's prompts are tokenized in process,
	// which is when forwarding kvroute's ids saves the engine work.
	Local(model string) bool
}

// chatFields are the fields of a chat body that reach the chat template,
// with vLLM's names; /v1/route and the proxy read the same ones.
type chatFields struct {
	Messages             json.RawMessage `json:"messages,omitempty"`
	Tools                json.RawMessage `json:"tools,omitempty"`
	Documents            json.RawMessage `json:"documents,omitempty"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs,omitempty"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage bool            `json:"continue_final_message,omitempty"`
	AddSpecialTokens     *bool           `json:"add_special_tokens,omitempty"`
	ReasoningEffort      string          `json:"reasoning_effort,omitempty"`
}

// present reports whether a raw JSON field was given a value.
func present(raw json.RawMessage) bool {
	b := strictjson.TrimSpace(raw)
	return len(b) > 0 && string(b) != "null"
}

// request is the tokenization request for a chat body's fields.
func (c chatFields) request(model string) (kvroute.TokenizeRequest, error) {
	if b := strictjson.TrimSpace(c.Messages); len(b) == 0 || b[0] != '[' {
		return kvroute.TokenizeRequest{}, &kvroute.FieldError{Field: "messages", Msg: "must be an array of messages"}
	}
	for name, raw := range map[string]json.RawMessage{"tools": c.Tools, "documents": c.Documents} {
		if b := strictjson.TrimSpace(raw); present(raw) && b[0] != '[' {
			return kvroute.TokenizeRequest{}, &kvroute.FieldError{Field: name, Msg: "must be an array"}
		}
	}
	if b := strictjson.TrimSpace(c.ChatTemplateKwargs); present(c.ChatTemplateKwargs) && b[0] != '{' {
		return kvroute.TokenizeRequest{}, &kvroute.FieldError{Field: "chat_template_kwargs", Msg: "must be an object"}
	}
	return kvroute.TokenizeRequest{
		Model: model, Messages: c.Messages, Tools: c.Tools, Documents: c.Documents,
		ChatTemplateKwargs: c.ChatTemplateKwargs, AddGenerationPrompt: c.AddGenerationPrompt,
		ContinueFinalMessage: c.ContinueFinalMessage, AddSpecialTokens: c.AddSpecialTokens,
		ReasoningEffort: c.ReasoningEffort,
	}, nil
}

// keyed is a decision together with how its prompt was tokenized.
type keyed struct {
	router.Decision
	prompt prompt.Result
}

// decide resolves the prompt, then decides on its tokens and records the
// decision's metrics. A prompt
// that cannot be tokenized is still routed (on load alone) and the
// decision says why it was cache-blind. The whole is the kvroute.decision
// span, the resolution its kvroute.tokenize child, the router's steps the
// others.
func (s *Server) decide(ctx context.Context, in prompt.Input, req router.Request) (k keyed, err error) {
	ctx, span := s.startDecision(ctx, req.Model, "")
	defer func() { endDecision(span, k, err) }()
	tctx, tspan := s.tracer.Start(ctx, "kvroute.tokenize")
	t0 := time.Now()
	res, err := s.prompts.Resolve(tctx, in)
	tokenize := time.Since(t0)
	if tspan.IsRecording() {
		tspan.SetAttributes(attribute.String("kvroute.tokenization", string(res.Source)), attribute.Int("kvroute.prompt_tokens", res.PromptTokens))
		if res.Blind != "" {
			tspan.SetAttributes(attribute.String("kvroute.cache_blind", res.Blind))
		}
		if err != nil {
			tspan.RecordError(err)
			tspan.SetStatus(codes.Error, err.Error())
		}
	}
	tspan.End()
	if err != nil {
		return keyed{}, err
	}
	if len(res.Tokens) > s.cfg.MaxTokens {
		field := "messages"
		switch {
		case in.HasTokenIDs:
			field = tokenField
		case in.Request.Prompt != nil:
			field = "prompt"
		}
		return keyed{}, &kvroute.FieldError{Field: field, Msg: fmt.Sprintf("has %d tokens, more than the limit of %d", len(res.Tokens), s.cfg.MaxTokens)}
	}
	req.Tokens = res.Tokens
	start := time.Now()
	d, err := s.cfg.route(ctx, req)
	if err != nil {
		return keyed{}, err
	}
	s.m.observe(ctx, d, res, time.Since(start), tokenize)
	return keyed{Decision: d, prompt: res}, nil
}

// believedCached is how many prompt tokens the decision expects the
// replica to serve from its cache. vLLM recomputes at least the prompt's
// last token (it needs its logits), so a prompt whose every block is
// cached is served one block short: the belief follows the same rule, so
// that only a stale index reads as a phantom.
func believedCached(k keyed) int {
	if k.Degraded || k.BlockSize <= 0 || k.prompt.PromptTokens == 0 || k.prompt.Partial != "" {
		return 0
	}
	limit := (k.prompt.PromptTokens - 1) / k.BlockSize * k.BlockSize
	return min(k.Matched*k.BlockSize, limit)
}

// ModelList answers GET /v1/models in OpenAI's shape.
type ModelList struct {
	Object string      `json:"object"`
	Data   []ModelInfo `json:"data"`
}

// ModelInfo is one model the registry serves.
type ModelInfo struct {
	ID      string `json:"id"`
	Object  string `json:"object"`
	OwnedBy string `json:"owned_by"`
	// Replicas counts the model's registered replicas; Routable those
	// that may receive traffic now.
	Replicas int `json:"replicas"`
	Routable int `json:"routable"`
	// Tokenizer says how its text and chat prompts are tokenized: local
	// (in kvroute) or remote (by its replicas).
	Tokenizer string `json:"tokenizer"`
}

// listModels answers GET /v1/models: the registry's models, so that an
// OpenAI client pointed at kvroute can discover what it serves.
func (s *Server) listModels(w http.ResponseWriter, r *http.Request) {
	reps, err := s.reg.ListReplicas(r.Context())
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	out := ModelList{Object: "list", Data: []ModelInfo{}}
	idx := map[string]int{}
	for _, rep := range reps {
		i, ok := idx[rep.Model]
		if !ok {
			i = len(out.Data)
			idx[rep.Model] = i
			tok := "remote"
			if s.prompts.Local(rep.Model) {
				tok = "local"
			}
			out.Data = append(out.Data, ModelInfo{ID: rep.Model, Object: "model", OwnedBy: "kvroute", Tokenizer: tok})
		}
		out.Data[i].Replicas++
		if rep.Routable() {
			out.Data[i].Routable++
		}
	}
	writeJSON(w, http.StatusOK, out)
}
