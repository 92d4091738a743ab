package api

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strconv"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"
)

// streamCutEvent is the event a stream whose replica failed mid-way ends
// with, shaped as OpenAI's mid-stream errors (the OpenAI SDKs raise an
// APIError on a data event carrying "error"). It names no replica: the
// client learns only that the answer is incomplete and may be retried.
var streamCutEvent = []byte(`data: {"error":{"message":"the response stream ended before the generation completed; retry the request","type":"api_error","param":null,"code":"` +
	CodeUpstream + `"}}` + "\n\n")

// doneEvent is the data line that ends an OpenAI stream.
var doneEvent = []byte("data: [DONE]")

// cutBody watches a replica's response body for a failure before its end:
// a read error that is not the client leaving (the replica died, or its
// connection was cut). httputil.ReverseProxy calls no hook then (the
// headers are sent), and would only abort the client's connection, which
// the client reads as a stream cut without a word. So a failure is
// counted, logged and makes the replica suspect; and a successful event
// stream (sse) ends instead with streamCutEvent and a clean end: the body
// passes whole events only, holding back an incomplete last one until
// its blank line or the clean end, so that the error event never lands
// in the middle of another. A failure after data: [DONE] is none: the
// answer was complete. A non-stream body's failure is passed on as it
// came (its Content-Length is already the client's).
type cutBody struct {
	io.ReadCloser
	sse bool
	// gone reports whether the client left (then a read error is its,
	// not the replica's); onCut records the replica's failure, once.
	gone  func() bool
	onCut func(err error)
	cut   bool
	// held is the incomplete last event; out what is ready to return;
	// end the error to return after it.
	held, out []byte
	done      bool
	end       error
}

func (b *cutBody) Read(p []byte) (int, error) {
	if !b.sse {
		n, err := b.ReadCloser.Read(p)
		if err != nil && !errors.Is(err, io.EOF) {
			b.failed(err)
		}
		return n, err
	}
	for len(b.out) == 0 && b.end == nil {
		n, err := b.ReadCloser.Read(p)
		b.take(p[:n])
		if err != nil {
			b.finish(err)
		}
	}
	n := copy(p, b.out)
	if n < len(b.out) {
		b.out = b.out[n:]
		return n, nil
	}
	b.out = b.out[:0] // its array serves the next events
	return n, b.end
}

// take passes the whole events of what was just read and holds the rest.
func (b *cutBody) take(chunk []byte) {
	if len(chunk) == 0 {
		return
	}
	data := append(b.held, chunk...)
	i := lastEventEnd(data)
	if !b.done && bytes.Contains(data[:i], doneEvent) {
		b.done = true
	}
	b.out = append(b.out, data[:i]...)
	b.held = append(b.held[:0], data[i:]...)
}

// finish ends the body on the source's err.
func (b *cutBody) finish(err error) {
	switch {
	case errors.Is(err, io.EOF):
		b.out, b.end = append(b.out, b.held...), io.EOF
	case b.done:
		b.end = io.EOF
	case !b.failed(err):
		b.out, b.end = append(b.out, b.held...), err
	default:
		b.out, b.end = append(b.out, streamCutEvent...), io.EOF
	}
	b.held = nil
}

// failed records err as the replica's failure unless the client left; it
// reports whether it was the replica's.
func (b *cutBody) failed(err error) bool {
	if b.gone() {
		return false
	}
	if !b.cut {
		b.cut = true
		b.onCut(err)
	}
	return true
}

// lastEventEnd is the index just past the last complete SSE event in b
// (its blank line included; see eventEnd), or 0.
func lastEventEnd(b []byte) int {
	end := 0
	if i := bytes.LastIndex(b, []byte("\n\n")); i >= 0 {
		end = i + 2
	}
	if i := bytes.LastIndex(b, []byte("\n\r\n")); i >= 0 && i+3 > end {
		end = i + 3
	}
	return end
}

// watchCut wraps body in a cutBody reporting on the current decision's
// replica: suspect for SuspectTTL, counted, logged.
func (p *proxyRequest) watchCut(body io.ReadCloser, sse bool) io.ReadCloser {
	s, id, ctx := p.s, p.d.Replica.ID, p.in.Context()
	return &cutBody{ReadCloser: body, sse: sse,
		gone: func() bool { return ctx.Err() != nil },
		onCut: func(err error) {
			s.rt.MarkSuspect(id, s.cfg.SuspectTTL)
			s.m.streamErrors.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attribute.String("replica", id), attribute.String("sse", strconv.FormatBool(sse))))
			p.span.AddEvent("response_cut", trace.WithAttributes(attribute.String("kvroute.replica", id)))
			s.log.WarnContext(ctx, "proxy: replica failed before its response ended; marked suspect", "replica", id, "sse", sse, "err", err)
		}}
}
