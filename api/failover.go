package api

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"syscall"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/dialer"
	"github.com/kvroute/kvroute/router"
)

// proxyRequest is one proxied request, from its decision to the end of
// the replica's answer. Its methods are the reverse proxy's hooks
// (RoundTrip here; rewrite, modifyResponse and handleError in proxy.go),
// so that what one hook changes and another reads are fields of one value
// rather than variables shared by closures.
//
// It is the reverse proxy's transport: when the replica fails before any
// response byte (refused, reset, closed before headers) and the decision
// scored another eligible replica, RoundTrip marks the failed one suspect,
// releases its booking, decides again (the router skips suspects, so the
// next best wins on fresh loads) and sends the same body there, at most
// Config.ProxyRetries times; a replica that sends no headers within the
// attempt's bound (bound.go) has failed so too. Nothing has reached the
// client yet, so the response hooks then answer with the new decision's
// headers. A failure after the response began is not retried: the client
// has part of an answer (cut.go ends it with an error event).
type proxyRequest struct {
	s *Server
	// w and in are the client's response and request (in on the proxy
	// span's context); only the response hooks write w.
	w   http.ResponseWriter
	in  *http.Request
	req router.Request
	// fw is the body as forwarded, sent again from the start on failover.
	fw forwarded
	// target is the first decision's replica; span the round trip's.
	target     *url.URL
	span       trace.Span
	stripToken bool
	// d and t are the current decision and its booking: RoundTrip moves
	// them to the next replica on failover, and the response hooks, which
	// run after it returns, report on them.
	d     keyed
	t     *tracker
	tried map[string]bool
	// bound is how long each attempt waits for its response headers
	// (headerBound); zero, unbounded.
	bound time.Duration
}

// RoundTrip sends out to the current replica, failing over as above.
func (p *proxyRequest) RoundTrip(out *http.Request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		// The proxy span's context (the client's own traceparent when
		// this pod does not trace) goes to the replica.
		p.s.inject(out.Context(), out.Header)
		// The engine of the decision this attempt follows (a failover's
		// may be another replica's, or none).
		setRankHeader(out.Header, p.d.Decision)
		resp, err := p.send(out)
		if err == nil {
			return resp, nil
		}
		if attempt >= p.s.cfg.ProxyRetries || out.Context().Err() != nil || !beforeResponse(err) {
			return resp, err
		}
		target, ok := p.failover(out.Context(), err)
		if !ok {
			return nil, err
		}
		out = p.retarget(out, target)
	}
}

// beforeResponse reports whether err means the replica sent nothing: the
// connection was refused or could not be made, or was reset or closed
// before the response's headers, or the headers did not come within the
// attempt's bound (bound.go). The request may be re-sent elsewhere.
func beforeResponse(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	var late *headerTimeoutError
	switch {
	case errors.As(err, &op) && op.Op == "dial", errors.As(err, &dns), errors.As(err, &late):
		return true
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return true
	}
	return false
}

// failover moves the request to the next replica; false when there is
// none to try (every other candidate was ineligible or tried, or the new
// decision could not be made).
func (p *proxyRequest) failover(ctx context.Context, cause error) (*url.URL, bool) {
	s, failed := p.s, p.d.Replica.ID
	s.rt.MarkSuspect(failed, s.cfg.SuspectTTL)
	s.m.failovers.Add(ctx, 1, label("replica", failed))
	trace.SpanFromContext(ctx).AddEvent("failover", trace.WithAttributes(attribute.String("kvroute.failed_replica", failed)))
	if !p.alternative() {
		return nil, false
	}
	p.t.release()
	dctx, cancel := context.WithTimeout(ctx, s.decisionTimeout(p.req))
	defer cancel()
	req := p.req
	req.Tokens = p.d.prompt.Tokens
	dctx, span := s.startDecision(dctx, req.Model, failed)
	start := time.Now()
	d, err := s.cfg.route(dctx, req)
	// The answer's wait is the whole request's.
	d.Queued += p.d.Queued
	next := keyed{Decision: d, prompt: p.d.prompt}
	endDecision(span, next, err)
	if err != nil {
		s.log.WarnContext(ctx, "proxy: no replica to fail over to", "failed", failed, "err", err)
		return nil, false
	}
	t := newTracker(ctx, s, d.RequestID)
	target, err := replicaTarget(d.Replica)
	if err != nil || p.tried[d.Replica.ID] {
		// Every other replica is suspect as well: the router fell back
		// to one already tried.
		t.release()
		return nil, false
	}
	s.m.observe(ctx, d, next.prompt, time.Since(start), -1)
	s.log.WarnContext(ctx, "proxy: replica failed before answering; trying the next", "failed", failed, "next", d.Replica.ID, "err", cause)
	p.tried[d.Replica.ID] = true
	p.d, p.t = next, t
	return target, true
}

// alternative reports whether the decision scored an eligible replica not
// tried yet.
func (p *proxyRequest) alternative() bool {
	for _, c := range p.d.Candidates {
		if c.Eligible && !p.tried[c.ID] {
			return true
		}
	}
	return false
}

// retarget is out aimed at target, with the body again from the start.
func (p *proxyRequest) retarget(out *http.Request, target *url.URL) *http.Request {
	next := out.Clone(out.Context())
	next.URL = &url.URL{Path: p.in.URL.Path, RawPath: p.in.URL.RawPath, RawQuery: out.URL.RawQuery}
	pr := &httputil.ProxyRequest{In: p.in, Out: next}
	pr.SetURL(target)
	setBody(next, p.bodyFor(p.d.Replica))
	return next
}

// setBody makes b out's body, from the start on every read of GetBody.
func setBody(out *http.Request, b []byte) {
	out.Body = io.NopCloser(bytes.NewReader(b))
	out.ContentLength = int64(len(b))
	out.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }
}

// guardedTransport connects through the replica address policy (package
// dialer): a replica's DNS name that resolves to a metadata service is
// refused at connect time, not only its URL at registration.
func guardedTransport(p kvroute.AddressPolicy) http.RoundTripper {
	return dialer.New(p, nil).Transport()
}
