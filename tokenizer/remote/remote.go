// Package remote tokenizes on the model's own replicas, through vLLM's
// tokenization endpoints, for models kvroute has no tokenizer files for.
// Parity is by construction (the engine's own tokenizer, template and
// message preprocessing); the price is a round trip and CPU on the
// replica's API server, so callers cache the answers.
package remote

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/dialer"
)

// Config wires a Client.
type Config struct {
	// Replicas lists the routable replicas of a model; required. The
	// router's cached registry answers it without a store round trip.
	Replicas func(ctx context.Context, model string) ([]kvroute.Replica, error)
	// Transport carries the calls. Nil means one connecting through
	// dialer.New(kvroute.AddressPolicy{}, nil), so that a replica's name
	// resolving to a metadata service is refused under the default policy;
	// kvroute passes one enforcing the operator's policy.
	Transport http.RoundTripper
	// Timeout bounds one call, attempts included; zero means 2 s. A
	// tokenization slower than that costs the decision more than the
	// cache hit it finds.
	Timeout time.Duration
	// Attempts is how many replicas are tried before giving up; zero
	// means 2.
	Attempts int
}

// Client is a remote tokenizer. It is safe for concurrent use.
type Client struct {
	cfg  Config
	http *http.Client
	next atomic.Uint64
	// noRender remembers replicas (by URL) whose server has no render
	// endpoint, so that each is asked only once.
	noRender sync.Map
}

// maxResponse bounds a replica's answer: a prompt's ids, generously.
const maxResponse = 64 << 20

// New builds a Client.
func New(cfg Config) (*Client, error) {
	if cfg.Replicas == nil {
		return nil, errors.New("remote: Config.Replicas is required")
	}
	if cfg.Transport == nil {
		cfg.Transport = dialer.New(kvroute.AddressPolicy{}, nil).Transport()
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 2 * time.Second
	}
	if cfg.Attempts <= 0 {
		cfg.Attempts = 2
	}
	return &Client{cfg: cfg, http: &http.Client{
		Transport: cfg.Transport,
		// A tokenizer endpoint that redirects is not one to follow.
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}}, nil
}

// Tokenize returns the token ids a replica of req.Model computes for the
// prompt. A prompt the replica refuses (its template raised, say) is a
// kvroute.FieldError carrying the replica's message.
func (c *Client) Tokenize(ctx context.Context, req kvroute.TokenizeRequest) ([]uint32, error) {
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	reps, err := c.cfg.Replicas(ctx, req.Model)
	if err != nil {
		return nil, fmt.Errorf("remote: replicas: %w", err)
	}
	if len(reps) == 0 {
		return nil, fmt.Errorf("remote: model %q has no routable replica: %w", req.Model, kvroute.ErrNoReplica)
	}
	start := int(c.next.Add(1) % uint64(len(reps)))
	var errs []error
	for i := range min(c.cfg.Attempts, len(reps)) {
		rep := reps[(start+i)%len(reps)]
		ids, err := c.tokenizeOn(ctx, strings.TrimRight(rep.URL, "/"), req)
		if err == nil || errors.Is(err, kvroute.ErrInvalidInput) {
			return ids, err
		}
		errs = append(errs, fmt.Errorf("%s: %w", rep.ID, err))
		if ctx.Err() != nil {
			break
		}
	}
	return nil, fmt.Errorf("remote: tokenize: %w", errors.Join(errs...))
}

// tokenizeOn asks one replica: its render endpoint first (newer vLLM:
// the engine's exact ids for a request body), else POST /tokenize.
func (c *Client) tokenizeOn(ctx context.Context, base string, req kvroute.TokenizeRequest) ([]uint32, error) {
	if _, no := c.noRender.Load(base); !no {
		path := "/v1/completions/render"
		if req.Chat() {
			path = "/v1/chat/completions/render"
		}
		ids, status, err := c.post(ctx, base+path, renderBody(req), "token_ids")
		switch {
		case err == nil:
			return ids, nil
		case status == http.StatusNotFound || status == http.StatusMethodNotAllowed:
			c.noRender.Store(base, true)
		default:
			return nil, err
		}
	}
	ids, _, err := c.post(ctx, base+"/tokenize", tokenizeBody(req), "tokens")
	return ids, err
}

// post sends body and reads the id list named field from the answer. It
// returns the HTTP status when the replica answered with an error.
func (c *Client) post(ctx context.Context, url string, body map[string]any, field string) ([]uint32, int, error) {
	raw, err := json.Marshal(body)
	if err != nil {
		return nil, 0, err
	}
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(raw))
	if err != nil {
		return nil, 0, err
	}
	hreq.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(hreq)
	if err != nil {
		return nil, 0, err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, maxResponse))
	if err != nil {
		return nil, resp.StatusCode, err
	}
	if resp.StatusCode == http.StatusBadRequest {
		return nil, resp.StatusCode, &kvroute.FieldError{Field: promptField(body), Msg: "were refused by the model's replica: " + errorMessage(data)}
	}
	if resp.StatusCode != http.StatusOK {
		return nil, resp.StatusCode, fmt.Errorf("%s answered %d: %s", url, resp.StatusCode, errorMessage(data))
	}
	var out map[string]json.RawMessage
	if err := json.Unmarshal(data, &out); err != nil {
		return nil, resp.StatusCode, fmt.Errorf("%s: %w", url, err)
	}
	var ids []uint32
	if err := json.Unmarshal(out[field], &ids); err != nil || out[field] == nil {
		return nil, resp.StatusCode, fmt.Errorf("%s: no %q list of token ids in the answer", url, field)
	}
	return ids, resp.StatusCode, nil
}

func promptField(body map[string]any) string {
	if _, ok := body["messages"]; ok {
		return "messages"
	}
	return "prompt"
}

// errorMessage is the message of an OpenAI-style error body, or the body.
func errorMessage(data []byte) string {
	var e struct {
		Error   json.RawMessage `json:"error"`
		Message string          `json:"message"`
	}
	if json.Unmarshal(data, &e) == nil {
		var inner struct {
			Message string `json:"message"`
		}
		switch {
		case json.Unmarshal(e.Error, &inner) == nil && inner.Message != "":
			return inner.Message
		case e.Message != "":
			return e.Message
		}
	}
	s := strings.TrimSpace(string(data))
	if len(s) > 300 {
		s = s[:300] + "…"
	}
	return s
}

// tokenizeBody is vLLM's /tokenize request for req.
func tokenizeBody(req kvroute.TokenizeRequest) map[string]any {
	b := map[string]any{"model": req.Model, "add_special_tokens": req.SpecialTokens()}
	if !req.Chat() {
		b["prompt"] = *req.Prompt
		return b
	}
	chatFields(b, req)
	return b
}

// renderBody is the request body the render endpoints take: the
// completion or chat request itself.
func renderBody(req kvroute.TokenizeRequest) map[string]any {
	b := map[string]any{"model": req.Model}
	if req.AddSpecialTokens != nil {
		b["add_special_tokens"] = *req.AddSpecialTokens
	}
	if !req.Chat() {
		b["prompt"] = *req.Prompt
		return b
	}
	chatFields(b, req)
	return b
}

func chatFields(b map[string]any, req kvroute.TokenizeRequest) {
	b["messages"] = req.Messages
	// Only what the client set: the replica applies its own defaults
	// (and its own checks of the combination) as it would to the request.
	if req.AddGenerationPrompt != nil {
		b["add_generation_prompt"] = *req.AddGenerationPrompt
	}
	if req.ContinueFinalMessage {
		b["continue_final_message"] = true
	}
	if req.ReasoningEffort != "" {
		b["reasoning_effort"] = req.ReasoningEffort
	}
	for name, v := range map[string]json.RawMessage{"tools": req.Tools, "documents": req.Documents, "chat_template_kwargs": req.ChatTemplateKwargs} {
		if len(v) > 0 && string(v) != "null" {
			b[name] = v
		}
	}
}
