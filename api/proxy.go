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
	"sync"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
)

// Degraded reasons reported in HeaderDegradedReason, comma-separated.
const (
	// ReasonNoTokenizer: the prompt was text or chat messages, which
	// kvroute cannot tokenize yet, so the decision was cache-blind (it
	// still weighs load).
	ReasonNoTokenizer = "no-tokenizer"
	// ReasonStoreUnavailable: the state store was bypassed.
	ReasonStoreUnavailable = "store-unavailable"
)

// progressTimeout bounds the store calls that report a proxied request's
// progress. They run on a context detached from the client's, because a
// client hanging up is exactly when the booking must still be released.
const progressTimeout = 2 * time.Second

// openAIRequest holds the few fields of an OpenAI completion or chat body
// that routing needs. Decoding is lenient: the body is forwarded untouched,
// and every other field is the replica's business.
type openAIRequest struct {
	Model  string          `json:"model"`
	Prompt json.RawMessage `json:"prompt"`
	// TokenIDs lets chat clients that tokenize themselves get cache-aware
	// routing; vLLM ignores the unknown field.
	TokenIDs            tokenIDs `json:"token_ids"`
	MaxTokens           *int     `json:"max_tokens"`
	MaxCompletionTokens *int     `json:"max_completion_tokens"`
	CacheSalt           string   `json:"cache_salt"`
}

// tokens returns the prompt's token ids and whether the body carried any.
// A text prompt or chat messages carry none until the tokenizer ships.
func (o *openAIRequest) tokens() ([]uint32, bool, error) {
	if o.TokenIDs != nil {
		return o.TokenIDs, true, nil
	}
	raw := trimSpace(o.Prompt)
	// A batch of prompts goes to one replica; its first prompt decides.
	if len(raw) > 0 && raw[0] == '[' {
		if inner := trimSpace(raw[1:]); len(inner) > 0 && inner[0] == '[' {
			var batch []json.RawMessage
			if err := json.Unmarshal(raw, &batch); err != nil {
				return nil, false, jsonError(err)
			}
			raw = trimSpace(batch[0])
		}
	}
	if len(raw) == 0 || raw[0] != '[' {
		return nil, false, nil
	}
	if inner := trimSpace(raw[1:]); len(inner) > 0 && inner[0] == '"' {
		return nil, false, nil // a list of text prompts
	}
	var ids tokenIDs
	if err := ids.UnmarshalJSON(raw); err != nil {
		var fe *kvroute.FieldError
		if errors.As(err, &fe) {
			return nil, false, &kvroute.FieldError{Field: "prompt", Msg: fe.Msg}
		}
		return nil, false, err
	}
	return ids, true, nil
}

// proxyOpenAI serves POST /v1/completions and /v1/chat/completions: it
// decides like /v1/route, then forwards the original body to the chosen
// replica and reports the request's progress itself, so that OpenAI
// clients get cache-aware routing without knowing kvroute exists.
func (s *Server) proxyOpenAI(w http.ResponseWriter, r *http.Request) {
	body, err := s.readBody(w, r)
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	var oa openAIRequest
	if err := json.Unmarshal(body, &oa); err != nil {
		s.writeError(w, r, jsonError(err))
		return
	}
	tokens, known, err := oa.tokens()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	if oa.Model == "" {
		s.writeError(w, r, &kvroute.FieldError{Field: "model", Msg: "is required"})
		return
	}
	if len(tokens) > s.cfg.MaxTokens {
		s.writeError(w, r, &kvroute.FieldError{Field: "prompt", Msg: fmt.Sprintf("has %d token ids, more than the limit of %d", len(tokens), s.cfg.MaxTokens)})
		return
	}
	req := router.Request{Model: oa.Model, Tokens: tokens, SessionID: r.Header.Get(HeaderSessionID), CacheSalt: oa.CacheSalt}
	for _, mt := range []*int{oa.MaxCompletionTokens, oa.MaxTokens} {
		if mt != nil && *mt > 0 {
			req.MaxTokens = *mt
			break
		}
	}

	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Timeout)
	d, err := s.decide(r.WithContext(ctx), req)
	cancel()
	if err != nil {
		s.writeError(w, r, err)
		return
	}
	t := &tracker{s: s, id: d.RequestID, ctx: context.WithoutCancel(r.Context())}
	target, err := url.Parse(d.Replica.URL)
	if err != nil || target.Scheme == "" || target.Host == "" {
		t.release()
		s.writeError(w, r, fmt.Errorf("%w: replica %s has an unusable url %q", errUpstream, d.Replica.ID, d.Replica.URL))
		return
	}

	if known {
		setDecisionHeaders(w.Header(), d)
	} else {
		setDecisionHeaders(w.Header(), d, ReasonNoTokenizer)
	}

	r.Body = io.NopCloser(bytes.NewReader(body))
	r.ContentLength = int64(len(body))
	rp := &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.SetURL(target)
			pr.SetXForwarded()
		},
		Transport: s.proxy,
		ErrorLog:  s.proxyLog,
		// Flush every write: token streams (SSE) must reach the client
		// as the replica produces them.
		FlushInterval: -1,
		ModifyResponse: func(resp *http.Response) error {
			resp.Body = &progressBody{ReadCloser: resp.Body, t: t, ok: resp.StatusCode < 300}
			return nil
		},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			t.release()
			if r.Context().Err() != nil {
				// The client hung up; nobody reads an answer.
				w.WriteHeader(statusClientClosed)
				return
			}
			s.writeError(w, r, fmt.Errorf("%w: replica %s: %v", errUpstream, d.Replica.ID, err))
		},
	}
	rp.ServeHTTP(w, r)
}

// tracker reports one proxied request's progress to the router. Release
// happens exactly once whichever way the response ends.
type tracker struct {
	s    *Server
	id   string
	ctx  context.Context
	once sync.Once
}

func (t *tracker) firstToken() {
	ctx, cancel := context.WithTimeout(t.ctx, progressTimeout)
	defer cancel()
	if _, err := t.s.rt.FirstToken(ctx, t.id); err != nil {
		t.s.log.Warn("report first token", "request_id", t.id, "err", err)
	}
}

func (t *tracker) release() {
	t.once.Do(func() {
		ctx, cancel := context.WithTimeout(t.ctx, progressTimeout)
		defer cancel()
		if _, err := t.s.rt.Release(ctx, t.id); err != nil {
			// The lease expires on its own; the load is over-counted
			// until then, not leaked.
			t.s.log.Warn("release", "request_id", t.id, "err", err)
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
			b.t.firstToken()
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
