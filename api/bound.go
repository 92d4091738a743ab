package api

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute/router"
)

// Defaults of the proxy's time-to-headers bound (Config.ProxyHeaderTimeout
// and Config.ProxyResponseFactor).
const (
	// DefaultProxyHeaderTimeout is a few seconds: vLLM answers a stream's
	// headers as soon as the request is queued, before any prefill, so a
	// replica that has not answered them by then is wedged, while the
	// client, still waiting, can be served elsewhere.
	DefaultProxyHeaderTimeout = 5 * time.Second
	// DefaultProxyResponseFactor is generous: the router's speeds are
	// already the slow side, and a non-streaming response cut for being
	// slow is generated twice and its healthy replica made suspect.
	DefaultProxyResponseFactor = 3.0
	// maxHeaderBound caps a non-streaming bound (as router.MaxLease caps
	// a booking), so that no request's numbers overflow a Duration.
	maxHeaderBound = router.MaxLease
)

// headerBound is how long one attempt of a proxied request may wait for
// its replica's response headers; zero means unbounded. A stream's
// headers come at once, so its bound is ProxyHeaderTimeout. A
// non-streaming response's headers come with the whole generation, so
// its bound is ProxyHeaderTimeout plus ProxyResponseFactor times the
// duration its booking predicts: the prompt at PrefillTPS (all of it, as
// if nothing were cached) and max_tokens at DecodeTPS. A non-streaming
// request without max_tokens is not bounded: it may generate up to the
// model's context, which nothing here can predict, and cutting a long
// generation would cost more than waiting on a hung replica (which the
// streaming requests' bound finds and makes suspect).
func (s *Server) headerBound(stream bool, req router.Request, d keyed) time.Duration {
	floor := s.cfg.ProxyHeaderTimeout
	switch {
	case floor < 0:
		return 0
	case floor == 0:
		floor = DefaultProxyHeaderTimeout
	}
	if stream {
		return floor
	}
	if req.MaxTokens <= 0 {
		return 0
	}
	factor, prefill, decode := s.cfg.ProxyResponseFactor, s.cfg.PrefillTPS, s.cfg.DecodeTPS
	promptTokens := max(len(d.prompt.Tokens), d.PromptBlocks*d.BlockSize)
	secs := floor.Seconds() + factor*(float64(promptTokens)/prefill+float64(req.MaxTokens)/decode)
	if !(secs < maxHeaderBound.Seconds()) { // NaN too
		return maxHeaderBound
	}
	return time.Duration(math.Round(secs * float64(time.Second)))
}

// headerTimeoutError is an attempt whose replica sent no response headers
// within its bound. It counts as a failure before the response
// (beforeResponse): the request may go to another replica.
type headerTimeoutError struct {
	after time.Duration
}

func (e *headerTimeoutError) Error() string {
	return fmt.Sprintf("no response headers within %v", e.after)
}

// send is one attempt on the current replica, bounded by p.bound: a timer
// cancels the attempt when the headers have not come by then. Once they
// have, the attempt's context lives on until the body is closed, for the
// body streams on it.
func (p *proxyRequest) send(out *http.Request) (*http.Response, error) {
	if p.bound <= 0 {
		return p.sendOnce(out)
	}
	ctx, cancel := context.WithCancel(out.Context())
	timer := time.AfterFunc(p.bound, cancel)
	resp, err := p.sendOnce(out.WithContext(ctx))
	if !timer.Stop() {
		// The bound passed first; headers that raced its cancel are
		// dropped with their body, which the cancel cut anyway.
		if err == nil {
			resp.Body.Close()
		}
		cancel()
		if cerr := out.Context().Err(); cerr != nil {
			return nil, cerr // the client left meanwhile
		}
		return nil, p.headerTimeout(out.Context())
	}
	if err != nil {
		cancel()
		return resp, err
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, cancel: cancel}
	return resp, nil
}

// sendOnce sends out, and once more without the priority field when the
// replica refuses it (priority.go).
func (p *proxyRequest) sendOnce(out *http.Request) (*http.Response, error) {
	resp, err := p.s.proxy.RoundTrip(out)
	if err != nil {
		return resp, err
	}
	return p.priorityRefused(out, resp)
}

// headerTimeout records a replica that missed its bound: it is marked
// suspect at once (also when no retry is left, unlike a refusal, so that
// the next decisions avoid it), counted and logged.
func (p *proxyRequest) headerTimeout(ctx context.Context) error {
	s, id := p.s, p.d.Replica.ID
	s.rt.MarkSuspect(id, s.cfg.SuspectTTL)
	s.m.headerTimeouts.Add(ctx, 1, label("replica", id))
	trace.SpanFromContext(ctx).AddEvent("header_timeout", trace.WithAttributes(attribute.String("kvroute.replica", id)))
	s.log.WarnContext(ctx, "proxy: replica sent no response headers in time; marked suspect", "replica", id, "bound", p.bound)
	return &headerTimeoutError{after: p.bound}
}

// cancelBody ends an attempt's context when the proxy closes the body.
type cancelBody struct {
	io.ReadCloser
	cancel context.CancelFunc
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.cancel()
	return err
}
