package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httputil"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/strictjson"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/router"
)

// Degraded reasons reported in HeaderDegradedReason, comma-separated,
// besides the front door's cache-blind reasons (prompt.Blind*).
const (
	// ReasonStoreUnavailable: the state store was bypassed.
	ReasonStoreUnavailable = "store-unavailable"
	// ReasonIndexIncomplete: no ingestor has caught up yet on the chosen
	// replica's events, so the decision may have missed what it holds.
	ReasonIndexIncomplete = "index-incomplete"
	// ReasonNoTokenizer: the prompt was text or chat for a model nobody
	// can tokenize, so the decision was cache-blind (it still weighs
	// load).
	ReasonNoTokenizer = prompt.BlindNoTokenizer
)

// progressTimeout bounds the store calls that report a proxied request's
// progress. They run on a context detached from the client's, because a
// client hanging up is exactly when the booking must still be released.
const progressTimeout = 2 * time.Second

// openAIRequest holds the fields of an OpenAI completion or chat body that
// routing reads. Decoding is lenient: every other field is the replica's
// business, and the body is forwarded as sent (but for the rewrites
// forwardBody makes).
type openAIRequest struct {
	Model        string          `json:"model"`
	Prompt       json.RawMessage `json:"prompt"`
	PromptEmbeds json.RawMessage `json:"prompt_embeds"`
	chatFields
	// TokenIDs lets clients that tokenize themselves get cache-aware
	// routing; vLLM ignores the unknown field.
	TokenIDs            tokenIDs        `json:"token_ids"`
	MaxTokens           *int            `json:"max_tokens"`
	MaxCompletionTokens *int            `json:"max_completion_tokens"`
	CacheSalt           string          `json:"cache_salt"`
	Stream              bool            `json:"stream"`
	StreamOptions       json.RawMessage `json:"stream_options"`
	// Priority is vLLM's priority field (an integer, lower first): the
	// request's admission band, forwarded only to a replica that
	// schedules by priority (see forwarded).
	Priority json.RawMessage `json:"priority"`
}

// input is the body's prompt for the front door. text is the single text
// prompt of a completion, the one case whose ids may be forwarded.
func (o *openAIRequest) input(chat bool) (in prompt.Input, text bool, err error) {
	switch {
	case o.TokenIDs != nil:
		in.TokenIDs, in.HasTokenIDs = o.TokenIDs, true
		return in, false, nil
	case chat:
		if !present(o.Messages) {
			return in, false, &kvroute.FieldError{Field: "messages", Msg: "is required"}
		}
		in.Request, err = o.chatFields.request(o.Model)
		return in, false, err
	case present(o.PromptEmbeds):
		in.PromptEmbeds = true
		return in, false, nil
	}
	raw := strictjson.TrimSpace(o.Prompt)
	if len(raw) == 0 || string(raw) == "null" {
		return in, false, &kvroute.FieldError{Field: "prompt", Msg: "is required"}
	}
	batch := false
	// A batch of prompts goes to one replica; its first prompt decides.
	if raw[0] == '[' {
		if inner := strictjson.TrimSpace(raw[1:]); len(inner) > 0 && (inner[0] == '[' || inner[0] == '"') {
			var list []json.RawMessage
			if err := json.Unmarshal(raw, &list); err != nil {
				return in, false, jsonError(err)
			}
			if len(list) == 0 {
				return in, false, &kvroute.FieldError{Field: "prompt", Msg: "is an empty list"}
			}
			raw, batch = strictjson.TrimSpace(list[0]), len(list) > 1
		}
	}
	if len(raw) > 0 && raw[0] == '"' {
		var s string
		if err := json.Unmarshal(raw, &s); err != nil {
			return in, false, &kvroute.FieldError{Field: "prompt", Msg: "must be a string, a list of strings, or token ids"}
		}
		in.Request = kvroute.TokenizeRequest{Model: o.Model, Prompt: &s, AddSpecialTokens: o.AddSpecialTokens}
		return in, !batch, nil
	}
	var ids tokenIDs
	if err := ids.UnmarshalJSON(raw); err != nil {
		var fe *kvroute.FieldError
		if errors.As(err, &fe) {
			return in, false, &kvroute.FieldError{Field: "prompt", Msg: fe.Msg}
		}
		return in, false, err
	}
	in.TokenIDs, in.HasTokenIDs = ids, true
	return in, false, nil
}

// proxyOpenAI serves POST /v1/completions and /v1/chat/completions: it
// tokenizes and decides like /v1/route, then forwards the body to the
// chosen replica and reports the request's progress itself, so that
// OpenAI clients get cache-aware routing without knowing kvroute exists.
// A replica that fails before answering is replaced by the next best
// (failover.go). With ?redirect=true it answers 307 instead (redirect).
func (s *Server) proxyOpenAI(w http.ResponseWriter, r *http.Request) {
	redirect, err := queryBool(r, "redirect")
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	body, err := s.readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var oa openAIRequest
	if err := decodeWith(body, &oa, openAIFields, false, unmarshalJSON); err != nil {
		s.writeError(w, r, err)
		return
	}
	req, in, text, err := s.openAIQuestion(r, &oa)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.decisionTimeout(req))
	d, err := s.decide(ctx, in, req)
	cancel()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if redirect {
		s.redirect(w, r, d)
		return
	}
	s.forward(w, r, body, &oa, req, d, text)
}

// openAIQuestion checks an OpenAI body, all of it before deciding so that
// a bad body books nothing, and turns it into the router's question and
// the prompt to resolve; text is input's (see openAIRequest.input).
func (s *Server) openAIQuestion(r *http.Request, oa *openAIRequest) (req router.Request, in prompt.Input, text bool, err error) {
	if err := (router.Request{Model: oa.Model}).Check(); err != nil {
		return req, in, false, err
	}
	in, text, err = oa.input(r.URL.Path == "/v1/chat/completions")
	if err != nil {
		return req, in, false, err
	}
	if b := strictjson.TrimSpace(oa.StreamOptions); present(oa.StreamOptions) && b[0] != '{' {
		return req, in, false, &kvroute.FieldError{Field: "stream_options", Msg: "must be an object"}
	}
	session, err := sessionHeader(r)
	if err == nil {
		err = checkKeyStrings("cache_salt", oa.CacheSalt)
	}
	if err != nil {
		return req, in, false, err
	}
	req = router.Request{Model: oa.Model, SessionID: session, CacheSalt: oa.CacheSalt}
	if err := proxyAdmission(&req, r, oa); err != nil {
		return req, in, false, err
	}
	if req.Tenant, err = s.tenant(r); err != nil {
		return req, in, false, err
	}
	for _, mt := range []struct {
		field string
		n     *int
	}{{"max_completion_tokens", oa.MaxCompletionTokens}, {"max_tokens", oa.MaxTokens}} {
		if mt.n == nil {
			continue
		}
		if err := s.checkOutputTokens(mt.field, *mt.n); err != nil {
			return req, in, false, err
		}
		if *mt.n > 0 && req.MaxTokens == 0 {
			req.MaxTokens = *mt.n
		}
	}
	return req, in, text, nil
}

// forward sends the body to d's replica through a reverse proxy whose
// hooks are one proxyRequest's. The round trip is its own span, which the
// replica gets as its traceparent (RoundTrip injects it into every
// attempt); the booking's progress reports are its children.
func (s *Server) forward(w http.ResponseWriter, r *http.Request, body []byte, oa *openAIRequest, req router.Request, d keyed, text bool) {
	pctx, pspan := s.startProxy(r.Context(), d)
	defer pspan.End()
	r = r.WithContext(pctx)
	p := &proxyRequest{s: s, w: w, in: r, req: req, d: d, span: pspan, tried: map[string]bool{d.Replica.ID: true},
		t: newTracker(r.Context(), s, d.RequestID)}
	var err error
	if p.target, err = replicaTarget(d.Replica); err == nil {
		p.fw, err = s.forwardBody(body, oa, req, d, text)
	}
	if err != nil {
		p.t.release()
		s.writeError(w, r, err)
		return
	}
	p.stripToken = s.isKvrouteToken(r)
	p.bound = s.headerBound(oa.Stream, req, d)
	first := p.bodyFor(d.Replica)
	r.Body = io.NopCloser(bytes.NewReader(first))
	r.ContentLength = int64(len(first))
	rp := &httputil.ReverseProxy{
		Rewrite:   p.rewrite,
		Transport: p,
		ErrorLog:  s.proxyLog,
		// Flush every write: token streams (SSE) must reach the client
		// as the replica produces them.
		FlushInterval:  -1,
		ModifyResponse: p.modifyResponse,
		ErrorHandler:   p.handleError,
	}
	rp.ServeHTTP(w, r)
}

// rewrite aims the outgoing request at the first decision's replica
// (RoundTrip re-aims it on failover).
func (p *proxyRequest) rewrite(pr *httputil.ProxyRequest) {
	pr.SetURL(p.target)
	pr.SetXForwarded()
	forwardQuery(pr.Out)
	if p.stripToken {
		// kvroute's own token is not the replica's business.
		pr.Out.Header.Del("Authorization")
	}
}

// modifyResponse answers with the decision that got the response (the
// last one, after a failover) and watches the body as the proxy copies it:
// its usage, its first byte, its end, and a failure before its end
// (cut.go).
func (p *proxyRequest) modifyResponse(resp *http.Response) error {
	s, d, ctx := p.s, p.d, p.in.Context()
	setDecisionHeaders(p.w.Header(), d)
	s.m.proxied.Add(ctx, 1, statusLabel(resp.StatusCode))
	if p.span.IsRecording() {
		p.span.SetAttributes(attribute.String("kvroute.replica", d.Replica.ID), attribute.Int("http.response.status_code", resp.StatusCode))
		if resp.StatusCode >= 500 {
			p.span.SetStatus(codes.Error, resp.Status)
		}
	}
	ok := resp.StatusCode < 300
	sse := ok && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream")
	var src io.ReadCloser = resp.Body
	if ok {
		believed := believedCached(d)
		src = newUsageTap(resp.Body, sse, p.fw.stripUsage, func(u usage) {
			s.m.served(ctx, d.Replica.ID, believed, u)
			s.checkPin(ctx, d, believed, u)
		})
		if p.fw.stripUsage {
			resp.Header.Del("Content-Length")
		}
	}
	resp.Body = p.watchCut(&progressBody{ReadCloser: src, t: p.t, ok: ok}, sse)
	return nil
}

// handleError answers a request no replica answered: the booking is
// released, and the error carries the last decision's headers.
func (p *proxyRequest) handleError(w http.ResponseWriter, r *http.Request, err error) {
	p.t.release()
	setDecisionHeaders(w.Header(), p.d)
	p.s.m.proxied.Add(p.in.Context(), 1, label("status", "error"))
	p.span.RecordError(err)
	p.span.SetStatus(codes.Error, err.Error())
	if r.Context().Err() != nil {
		// The client hung up; nobody reads an answer.
		w.WriteHeader(statusClientClosed)
		return
	}
	p.s.writeError(w, r, fmt.Errorf("%w: replica %s: %v", errUpstream, p.d.Replica.ID, err))
}

// openAIFields are the top-level fields the proxy reads; their case
// variants are refused (encoding/json would take "MODEL" for model, and
// the replica would not).
var openAIFields = strictjson.Fields(reflect.TypeFor[openAIRequest]())

// replicaTarget is the base URL proxied requests to rep go to.
func replicaTarget(rep kvroute.Replica) (*url.URL, error) {
	target, err := kvroute.ReplicaURL(rep.URL)
	if err != nil {
		return nil, fmt.Errorf("%w: replica %s has an unusable url: %v", errUpstream, rep.ID, err)
	}
	return target, nil
}

// forwardQuery drops kvroute's own query parameters from a proxied
// request; the rest are the replica's.
func forwardQuery(out *http.Request) {
	if out.URL.RawQuery == "" {
		return
	}
	q := out.URL.Query()
	q.Del("redirect")
	out.URL.RawQuery = q.Encode()
}

// redirect answers an OpenAI request with a 307 to the chosen replica's
// same path: the client re-posts its own body there (a 307 keeps the
// method and body), carrying the decision in its headers. kvroute does not
// see the re-posted request, so its booking stays: the load is real until
// the replica finishes, and the client may report first-token and release
// with X-Kvroute-Request-Id as a decision-API client does; otherwise the
// lease expires by itself (expires_at, at most the router's MaxLease).
// The body is the decision, as /v1/route answers it.
func (s *Server) redirect(w http.ResponseWriter, r *http.Request, d keyed) {
	target, err := replicaTarget(d.Replica)
	if err != nil {
		if _, rerr := s.rt.Release(context.WithoutCancel(r.Context()), d.RequestID); rerr != nil {
			s.log.WarnContext(r.Context(), "release", "request_id", d.RequestID, "err", rerr)
		}
		s.writeError(w, r, err)
		return
	}
	loc := *target
	loc.Path = strings.TrimRight(target.Path, "/") + r.URL.Path
	loc.RawPath = ""
	out := &http.Request{URL: &url.URL{RawQuery: r.URL.RawQuery}}
	forwardQuery(out)
	loc.RawQuery = out.URL.RawQuery
	setDecisionHeaders(w.Header(), d)
	w.Header().Set("Location", loc.String())
	s.m.proxied.Add(r.Context(), 1, statusLabel(http.StatusTemporaryRedirect))
	writeJSON(w, http.StatusTemporaryRedirect, routeResponse(d))
}

// forwarded is the body sent to the replica and what was changed in it.
type forwarded struct {
	body []byte
	// bare is body without its priority field, for a replica that does
	// not schedule by priority (vLLM refuses a non-zero priority unless
	// started with --scheduling-policy priority); nil when body has
	// none.
	bare []byte
	// stripUsage is true when kvroute asked a stream for its usage chunk
	// (to compare cached tokens) and the client did not: the chunk is
	// removed from what the client receives.
	stripUsage bool
}

// forwardBody is the body the replica gets: the client's, with three
// rewrites. A completion's text prompt that kvroute tokenized itself goes
// as the ids it keyed (vLLM takes a token-id prompt), so the engine does
// not tokenize again and caches exactly the blocks kvroute keyed. A
// stream asks for its usage chunk, which carries the cached-token count
// that believed-versus-served compares. And a priority given in
// HeaderPriority goes in vLLM's field, so that a replica scheduling by
// priority orders the request as the queue did; bare is the body without
// it, for replicas that do not.
func (s *Server) forwardBody(body []byte, oa *openAIRequest, req router.Request, d keyed, text bool) (forwarded, error) {
	fw := forwarded{body: body}
	edits := map[string]any{}
	if oa.Priority == nil && req.Priority != 0 {
		edits[priorityField] = req.Priority
	}
	if text && !s.cfg.NoTokenForwarding && d.prompt.Forward {
		edits["prompt"] = d.prompt.Tokens
	}
	if oa.Stream {
		opts := map[string]json.RawMessage{}
		if present(oa.StreamOptions) {
			if err := json.Unmarshal(oa.StreamOptions, &opts); err != nil {
				return fw, &kvroute.FieldError{Field: "stream_options", Msg: "must be an object"}
			}
		}
		if string(opts["include_usage"]) != "true" {
			opts["include_usage"] = json.RawMessage("true")
			edits["stream_options"] = opts
			fw.stripUsage = true
		}
	}
	if len(edits) == 0 && oa.Priority == nil {
		return fw, nil
	}
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return fw, jsonError(err)
	}
	if len(edits) == 0 {
		// Only the priority to strip: the body goes as sent to replicas
		// that schedule by it.
		delete(top, priorityField)
		bare, err := json.Marshal(top)
		if err != nil {
			return fw, fmt.Errorf("api: forward: %w", err)
		}
		fw.bare = bare
		return fw, nil
	}
	for k, v := range edits {
		raw, err := json.Marshal(v)
		if err != nil {
			return fw, fmt.Errorf("api: forward: %w", err)
		}
		top[k] = raw
	}
	out, err := json.Marshal(top)
	if err != nil {
		return fw, fmt.Errorf("api: forward: %w", err)
	}
	fw.body = out
	if _, ok := top[priorityField]; ok {
		delete(top, priorityField)
		if fw.bare, err = json.Marshal(top); err != nil {
			return fw, fmt.Errorf("api: forward: %w", err)
		}
	}
	return fw, nil
}

// tracker reports one proxied request's progress to the router. Release
// happens exactly once whichever way the response ends, and after the
// first-token report when one was started: a non-streaming answer's
// first bytes and its end arrive together, and a release the store saw
// first would take the request for one that ended before its prefill
// (withdrawing its predicted entry, which the index may not yet replace).
type tracker struct {
	s    *Server
	id   string
	ctx  context.Context
	once sync.Once
	// reported is closed once the first-token report is made; started
	// says one was begun (release waits only then).
	started  atomic.Bool
	reported chan struct{}
}

func newTracker(ctx context.Context, s *Server, id string) *tracker {
	return &tracker{s: s, id: id, ctx: context.WithoutCancel(ctx), reported: make(chan struct{})}
}

// startFirstToken reports the first token off the caller's path: the
// client's first byte must not wait for a store round trip.
func (t *tracker) startFirstToken() {
	t.started.Store(true)
	go func() {
		defer close(t.reported)
		t.firstToken()
	}()
}

func (t *tracker) firstToken() {
	ctx, cancel := context.WithTimeout(t.ctx, progressTimeout)
	defer cancel()
	// A report queued for retry (the store is down) is the router's to
	// deliver; the outage itself is logged once by the router.
	if _, err := t.s.rt.FirstToken(ctx, t.id); err != nil && !errors.Is(err, router.ErrQueued) {
		t.s.log.WarnContext(t.ctx, "report first token", "request_id", t.id, "err", err)
	}
}

func (t *tracker) release() {
	t.once.Do(func() {
		ctx, cancel := context.WithTimeout(t.ctx, progressTimeout)
		defer cancel()
		if t.started.Load() {
			select {
			case <-t.reported:
			case <-ctx.Done():
			}
		}
		if _, err := t.s.rt.Release(ctx, t.id); err != nil && !errors.Is(err, router.ErrQueued) {
			// The lease expires on its own; the load is over-counted
			// until then, not leaked.
			t.s.log.WarnContext(t.ctx, "release", "request_id", t.id, "err", err)
		}
	})
}

// progressBody watches the replica's response as the proxy copies it: the
// first bytes of a successful response mean prefill is over, and the end of
// the body (EOF, error, or Close) means the request is.
type progressBody struct {
	io.ReadCloser
	t    *tracker
	ok   bool
	seen bool
}

func (b *progressBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if n > 0 && !b.seen {
		b.seen = true
		if b.ok {
			b.t.startFirstToken()
		}
	}
	if err != nil {
		b.t.release()
	}
	return n, err
}

func (b *progressBody) Close() error {
	err := b.ReadCloser.Close()
	b.t.release()
	return err
}
