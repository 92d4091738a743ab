package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/go-chi/chi/v5"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/strictjson"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// Headers the API reads and writes. Decisions travel in headers as well as
// in bodies so that a 307 redirect or a proxied stream still carries them.
const (
	HeaderSessionID      = "X-Session-Id"
	HeaderRequestID      = "X-Kvroute-Request-Id"
	HeaderReplica        = "X-Kvroute-Replica"
	HeaderDegradedReason = "X-Kvroute-Degraded-Reason"
	// HeaderTokenization says where the prompt's ids came from (given,
	// local, remote, none), as RouteResponse.Tokenization does.
	HeaderTokenization = "X-Kvroute-Tokenization"
	// HeaderMatchedBlocks is RouteResponse.MatchedBlocks, for proxied
	// clients: how many of the prompt's blocks the chosen replica holds.
	HeaderMatchedBlocks = "X-Kvroute-Matched-Blocks"
)

// RouteRequest is the body of POST /v1/route. The prompt comes in exactly
// one of three forms: token ids, a text prompt (tokenized as vLLM's
// /v1/completions would), or chat messages with their options (rendered
// and tokenized as its /v1/chat/completions would).
type RouteRequest struct {
	Model    string   `json:"model"`
	TokenIDs tokenIDs `json:"token_ids"`
	Prompt   *string  `json:"prompt,omitempty"`
	chatFields
	SessionID string `json:"session_id,omitempty"`
	CacheSalt string `json:"cache_salt,omitempty"`
	LoRA      string `json:"lora,omitempty"`
	// MaxTokens is the expected output length; it sizes the lease.
	MaxTokens *int   `json:"max_tokens,omitempty"`
	Policy    string `json:"policy,omitempty"`
	// Explain asks for every candidate's score in the answer.
	Explain bool `json:"explain,omitempty"`
	// Priority is the request's admission band, as vLLM's priority:
	// lower is admitted first, 0 (absent) the default.
	Priority *int64 `json:"priority,omitempty"`
	// MaxWaitMS is how long the request may wait for a replica with room
	// when the fleet is at capacity, in milliseconds; absent or 0 it does
	// not wait: the answer is a 429 at once, with its queue position.
	MaxWaitMS *int64 `json:"max_wait_ms,omitempty"`
}

// ReplicaRef is where a decision sends the request.
type ReplicaRef struct {
	ID  string `json:"id"`
	URL string `json:"url"`
}

// RouteResponse is the answer of POST /v1/route.
type RouteResponse struct {
	RequestID     string     `json:"request_id"`
	Replica       ReplicaRef `json:"replica"`
	MatchedBlocks int        `json:"matched_blocks"`
	// Approximate is true when the match is known only from the router's
	// own past decisions (a replica that publishes no events).
	Approximate  bool   `json:"approximate"`
	PromptBlocks int    `json:"prompt_blocks"`
	BlockSize    int    `json:"block_size"`
	Policy       string `json:"policy"`
	Mode         string `json:"mode,omitempty"`
	// Degraded is true when the state store was bypassed; Reason says why.
	Degraded bool   `json:"degraded"`
	Reason   string `json:"reason,omitempty"`
	// ExpiresAt is when the booked load is released if the client never
	// reports the request's end. A decision that bypassed the store books
	// nothing and has none; one made while the index is rebuilt after the
	// store lost its data (degraded, with the store-reset reason) is booked.
	ExpiresAt time.Time `json:"expires_at,omitzero"`
	// Tokenization says where the prompt's token ids came from: given,
	// local, remote, or none (then CacheBlind says why, and the decision
	// weighed load alone). PromptTokens is the prompt's length in tokens.
	Tokenization string `json:"tokenization"`
	PromptTokens int    `json:"prompt_tokens"`
	CacheBlind   string `json:"cache_blind,omitempty"`
	// Partial says why only a prefix of the prompt was keyed
	// ("multimodal": the text before the first media part).
	Partial string `json:"partial,omitempty"`
	// IndexIncomplete is true when no ingestor has caught up yet on the
	// chosen replica's events (just registered, or its ingestor died):
	// matched_blocks may be short of what it holds.
	IndexIncomplete bool `json:"index_incomplete,omitempty"`
	// DataParallelRank is the engine of a data-parallel replica the
	// decision chose, for the X-data-parallel-rank header; absent when
	// the replica has one engine or picks its own.
	DataParallelRank *int `json:"data_parallel_rank,omitempty"`
	// QueuedMS is how long the request waited for admission, in
	// milliseconds; absent when it was admitted at once.
	QueuedMS int64 `json:"queued_ms,omitempty"`
	// PredictedBlocks is the leading blocks the chosen replica is
	// predicted to hold once the prefill booked there (another request's
	// in flight) has run, when the decision counted them; absent when it
	// did not.
	PredictedBlocks int             `json:"predicted_blocks,omitempty"`
	Candidates      []scoring.Score `json:"candidates,omitempty"`
}

// ProgressResponse answers first-token and release. Found is false when
// the lease is already gone (released, or expired): repeating a report is
// harmless, so it is not an error.
type ProgressResponse struct {
	RequestID string `json:"request_id"`
	Found     bool   `json:"found"`
	// Queued is true when the store could not be reached and the report
	// was queued in process for retry (answered 202): there is nothing for
	// the client to retry.
	Queued bool `json:"queued,omitempty"`
}

// route answers POST /v1/route: a JSON decision. The client owns the
// request's lifecycle and should report first-token and release.
//
// It does not redirect: a 307 makes the client re-post the same body, and
// a decision's body is not a completion a replica accepts. ?redirect=true
// is a 400 pointing at the OpenAI endpoints, whose 307 has the client
// re-post its own OpenAI body (see proxyOpenAI); ?redirect=false is
// accepted and changes nothing.
func (s *Server) route(w http.ResponseWriter, r *http.Request) {
	redirect, err := queryBool(r, "redirect")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if redirect {
		s.writeError(w, r, &kvroute.FieldError{Field: "redirect", Msg: "is not supported on /v1/route (a 307 would re-post the decision body, which no replica accepts): " +
			"POST the OpenAI body to /v1/completions?redirect=true or /v1/chat/completions?redirect=true, or send it to the decision's replica.url"})
		return
	}
	if _, ok := r.URL.Query()["path"]; ok {
		s.writeError(w, r, &kvroute.FieldError{Field: "path", Msg: "is not supported: /v1/route does not redirect (see redirect)"})
		return
	}
	raw, err := s.readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var body RouteRequest
	defer func() {
		// Client-given ids are read by nothing after the answer: the body
		// and the ids go back to their pools (strictjson.Pool).
		if body.Prompt == nil && !present(body.Messages) {
			bodyBufs.Put(raw)
			strictjson.IDs.Put(body.TokenIDs)
		}
	}()
	if err := decodeBody(raw, &body); err != nil {
		s.writeError(w, r, err)
		return
	}
	session, err := sessionHeader(r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	req, in, err := s.routeRequest(body, session)
	if err == nil {
		err = routeAdmission(&req, body)
	}
	if err == nil {
		req.Tenant, err = s.tenant(r)
	}
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.decisionTimeout(req))
	defer cancel()
	d, err := s.decide(ctx, in, req)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	resp := routeResponse(d)
	if body.Explain {
		resp.Candidates = d.Candidates
	}
	setDecisionHeaders(w.Header(), d)
	writeJSON(w, http.StatusOK, resp)
}

// routeResponse is a decision's answer, without the candidates.
func routeResponse(d keyed) RouteResponse {
	var rank *int
	if d.Pinned {
		rank = &d.DataParallelRank
	}
	return RouteResponse{
		DataParallelRank: rank,
		RequestID:        d.RequestID, Replica: ReplicaRef{ID: d.Replica.ID, URL: d.Replica.URL},
		MatchedBlocks: d.Matched, Approximate: d.Approximate, PromptBlocks: d.PromptBlocks,
		BlockSize: d.BlockSize, Policy: string(d.Policy), Mode: d.Mode,
		Degraded: d.Degraded, Reason: d.Reason, ExpiresAt: d.Expires,
		Tokenization: string(d.prompt.Source), PromptTokens: d.prompt.PromptTokens,
		CacheBlind: d.prompt.Blind, Partial: d.prompt.Partial, IndexIncomplete: d.IndexIncomplete,
		QueuedMS: queuedMS(d.Queued), PredictedBlocks: d.PredictedBlocks,
	}
}

// maxKeyBytes bounds the request strings that reach block keys and
// session hashing (session id, cache salt, LoRA name).
const maxKeyBytes = 1024

// sessionHeader is the X-Session-Id header, checked as the body's
// session_id is: a header is input too, and its error is JSON like any.
func sessionHeader(r *http.Request) (string, error) {
	vals := r.Header.Values(HeaderSessionID)
	switch {
	case len(vals) == 0:
		return "", nil
	case len(vals) > 1:
		return "", &kvroute.FieldError{Field: HeaderSessionID, Msg: "is given more than once"}
	case len(vals[0]) > maxKeyBytes || !utf8.ValidString(vals[0]):
		return "", &kvroute.FieldError{Field: HeaderSessionID, Msg: fmt.Sprintf("must be at most %d bytes of UTF-8", maxKeyBytes)}
	}
	return vals[0], nil
}

// checkKeyStrings bounds the strings of a request that are hashed.
func checkKeyStrings(fields ...string) error {
	for i := 0; i+1 < len(fields); i += 2 {
		if len(fields[i+1]) > maxKeyBytes {
			return &kvroute.FieldError{Field: fields[i], Msg: fmt.Sprintf("is longer than %d bytes", maxKeyBytes)}
		}
	}
	return nil
}

// queryBool reads a boolean query parameter strictly: absent is false,
// and a value other than true or false is a 400 naming the parameter
// (?redirect=yes must not be silently ignored).
func queryBool(r *http.Request, name string) (bool, error) {
	vals, ok := r.URL.Query()[name]
	if !ok {
		return false, nil
	}
	if len(vals) != 1 {
		return false, &kvroute.FieldError{Field: name, Msg: "is given more than once"}
	}
	switch vals[0] {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, &kvroute.FieldError{Field: name, Msg: fmt.Sprintf("must be true or false, got %q", truncate([]byte(vals[0])))}
}

// routeRequest validates a decoded body and turns it into the router's
// question and the prompt to tokenize. The session header is a fallback:
// the body is more specific.
func (s *Server) routeRequest(b RouteRequest, sessionHeader string) (router.Request, prompt.Input, error) {
	var in prompt.Input
	req := router.Request{Model: b.Model, Policy: scoring.Policy(b.Policy)}
	if err := req.Check(); err != nil {
		return router.Request{}, in, err
	}
	forms := 0
	for _, given := range []bool{b.TokenIDs != nil, b.Prompt != nil, present(b.Messages)} {
		if given {
			forms++
		}
	}
	switch {
	case forms == 0:
		return router.Request{}, in, &kvroute.FieldError{Field: tokenField, Msg: "is required: give the prompt as token_ids, prompt (text) or messages (chat)"}
	case forms > 1:
		return router.Request{}, in, &kvroute.FieldError{Field: tokenField, Msg: "conflicts: give exactly one of token_ids, prompt and messages"}
	case b.TokenIDs != nil:
		if len(b.TokenIDs) > s.cfg.MaxTokens {
			return router.Request{}, in, &kvroute.FieldError{Field: tokenField, Msg: fmt.Sprintf("has %d ids, more than the limit of %d", len(b.TokenIDs), s.cfg.MaxTokens)}
		}
		in.TokenIDs, in.HasTokenIDs = b.TokenIDs, true
	case b.Prompt != nil:
		in.Request = kvroute.TokenizeRequest{Model: b.Model, Prompt: b.Prompt, AddSpecialTokens: b.AddSpecialTokens}
	default:
		tr, err := b.chatFields.request(b.Model)
		if err != nil {
			return router.Request{}, in, err
		}
		in.Request = tr
	}
	if err := checkKeyStrings("session_id", b.SessionID, "cache_salt", b.CacheSalt, "lora", b.LoRA); err != nil {
		return router.Request{}, in, err
	}
	req.SessionID, req.CacheSalt, req.LoRA = b.SessionID, b.CacheSalt, b.LoRA
	if req.SessionID == "" {
		req.SessionID = sessionHeader
	}
	if b.MaxTokens != nil {
		if err := s.checkOutputTokens("max_tokens", *b.MaxTokens); err != nil {
			return router.Request{}, in, err
		}
		req.MaxTokens = *b.MaxTokens
	}
	return req, in, nil
}

// checkOutputTokens bounds a client's output length, which sizes the
// decode booking and the lease: one request must not be able to take a
// replica out of cache-aware routing.
func (s *Server) checkOutputTokens(field string, n int) error {
	switch {
	case n < 0:
		return &kvroute.FieldError{Field: field, Msg: "must be >= 0"}
	case n > s.cfg.MaxOutputTokens:
		return &kvroute.FieldError{Field: field, Msg: fmt.Sprintf("is %d, more than the limit of %d", n, s.cfg.MaxOutputTokens)}
	}
	return nil
}

// setDecisionHeaders puts the decision where redirected and proxied
// clients can see it without parsing a body. reasons are degradations the
// caller knows of besides the router's own.
func setDecisionHeaders(h http.Header, d keyed) {
	h.Set(HeaderRequestID, d.RequestID)
	h.Set(HeaderReplica, d.Replica.ID)
	h.Set(HeaderTokenization, string(d.prompt.Source))
	h.Set(HeaderMatchedBlocks, strconv.Itoa(d.Matched))
	setRankHeader(h, d.Decision)
	if ms := queuedMS(d.Queued); ms > 0 {
		h.Set(HeaderQueuedMs, strconv.FormatInt(ms, 10))
	} else {
		// A failover's decision may not have waited where the first did.
		h.Del(HeaderQueuedMs)
	}
	var reasons []string
	if d.IndexIncomplete {
		reasons = append(reasons, ReasonIndexIncomplete)
	}
	if d.prompt.Blind != "" {
		reasons = append(reasons, d.prompt.Blind)
	}
	if d.Degraded {
		reasons = append(reasons, ReasonStoreUnavailable)
	}
	if len(reasons) > 0 {
		h.Set(HeaderDegradedReason, strings.Join(reasons, ","))
	}
}

// firstToken answers POST /v1/requests/{id}/first-token: the request's
// booking moves from prefill to decode.
func (s *Server) firstToken(w http.ResponseWriter, r *http.Request) {
	s.progress(w, r, s.rt.FirstToken)
}

// release answers POST /v1/requests/{id}/release: the request's booking
// ends.
func (s *Server) release(w http.ResponseWriter, r *http.Request) {
	s.progress(w, r, s.rt.Release)
}

// progress answers a progress report. One the router queued because the
// store is unreachable is a 202, not a 503: the router retries it, and a
// client told to retry would only queue it again.
func (s *Server) progress(w http.ResponseWriter, r *http.Request, report func(ctx context.Context, id string) (bool, error)) {
	id := chi.URLParam(r, "id")
	found, err := report(r.Context(), id)
	switch {
	case errors.Is(err, router.ErrQueued):
		writeJSON(w, http.StatusAccepted, ProgressResponse{RequestID: id, Queued: true})
	case err != nil:
		s.writeError(w, r, err)
	default:
		writeJSON(w, http.StatusOK, ProgressResponse{RequestID: id, Found: found})
	}
}
