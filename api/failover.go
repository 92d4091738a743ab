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

// upstream is one proxied request's replica and booking. It is the
// reverse proxy's transport: when the replica fails before any response
// byte (refused, reset, closed before headers) and the decision scored
// another eligible replica, it marks the failed one suspect, releases its
// booking, decides again (the router skips suspects, so the next best
// wins on fresh loads) and sends the same body there, at most
// Config.ProxyRetries times. Nothing has reached the client yet, so the
// decision headers are replaced too. A failure after the response began
// is not retried: the client has part of an answer.
type upstream struct {
	s     *Server
	w     http.ResponseWriter
	in    *http.Request
	req   router.Request
	body  []byte
	d     keyed
	t     *tracker
	tried map[string]bool
}

// RoundTrip sends out to the current replica, failing over as above.
func (u *upstream) RoundTrip(out *http.Request) (*http.Response, error) {
	for attempt := 0; ; attempt++ {
		// The proxy span's context (the client's own traceparent when
		// this pod does not trace) goes to the replica.
		u.s.inject(out.Context(), out.Header)
		resp, err := u.s.proxy.RoundTrip(out)
		if err == nil || attempt >= u.s.cfg.ProxyRetries || out.Context().Err() != nil || !beforeResponse(err) {
			return resp, err
		}
		target, ok := u.failover(out.Context(), err)
		if !ok {
			return nil, err
		}
		out = u.retarget(out, target)
	}
}

// beforeResponse reports whether err means the replica sent nothing: the
// connection was refused or could not be made, or was reset or closed
// before the response's headers. The request may be re-sent elsewhere.
func beforeResponse(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	switch {
	case errors.As(err, &op) && op.Op == "dial", errors.As(err, &dns):
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
func (u *upstream) failover(ctx context.Context, cause error) (*url.URL, bool) {
	s, failed := u.s, u.d.Replica.ID
	s.rt.MarkSuspect(failed, s.cfg.SuspectTTL)
	s.m.failovers.Add(ctx, 1, label("replica", failed))
	trace.SpanFromContext(ctx).AddEvent("failover", trace.WithAttributes(attribute.String("kvroute.failed_replica", failed)))
	if !u.alternative() {
		return nil, false
	}
	u.t.release()
	dctx, cancel := context.WithTimeout(ctx, s.cfg.Timeout)
	defer cancel()
	req := u.req
	req.Tokens = u.d.prompt.Tokens
	dctx, span := s.startDecision(dctx, req.Model, failed)
	start := time.Now()
	d, err := s.rt.Route(dctx, req)
	next := keyed{Decision: d, prompt: u.d.prompt}
	endDecision(span, next, err)
	if err != nil {
		s.log.WarnContext(ctx, "proxy: no replica to fail over to", "failed", failed, "err", err)
		return nil, false
	}
	t := &tracker{s: s, id: d.RequestID, ctx: context.WithoutCancel(ctx)}
	target, err := replicaTarget(d.Replica)
	if err != nil || u.tried[d.Replica.ID] {
		// Every other replica is suspect as well: the router fell back
		// to one already tried.
		t.release()
		return nil, false
	}
	s.m.observe(ctx, d, next.prompt, time.Since(start), -1)
	s.log.WarnContext(ctx, "proxy: replica failed before answering; trying the next", "failed", failed, "next", d.Replica.ID, "err", cause)
	u.tried[d.Replica.ID] = true
	u.d, u.t = next, t
	setDecisionHeaders(u.w.Header(), next)
	return target, true
}

// alternative reports whether the decision scored an eligible replica not
// tried yet.
func (u *upstream) alternative() bool {
	for _, c := range u.d.Candidates {
		if c.Eligible && !u.tried[c.ID] {
			return true
		}
	}
	return false
}

// retarget is out aimed at target, with the body again from the start.
func (u *upstream) retarget(out *http.Request, target *url.URL) *http.Request {
	next := out.Clone(out.Context())
	next.URL = &url.URL{Path: u.in.URL.Path, RawPath: u.in.URL.RawPath, RawQuery: out.URL.RawQuery}
	pr := &httputil.ProxyRequest{In: u.in, Out: next}
	pr.SetURL(target)
	next.Body = io.NopCloser(bytes.NewReader(u.body))
	next.ContentLength = int64(len(u.body))
	next.GetBody = func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(u.body)), nil }
	return next
}

// guardedTransport connects through the replica address policy (package
// dialer): a replica's DNS name that resolves to a metadata service is
// refused at connect time, not only its URL at registration.
func guardedTransport(p kvroute.AddressPolicy) http.RoundTripper {
	return dialer.New(p, nil).Transport()
}
