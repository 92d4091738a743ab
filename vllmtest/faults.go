package vllmtest

import (
	"context"
	"net/http"
)

// HTTP faults of the generation endpoints, for the proxy's tests: a wedged
// engine behind a live API server, and a replica dying mid-response.

// HangBeforeHeaders(true) makes POST /v1/completions and
// /v1/chat/completions read their body and then never answer (no status
// line, no headers) until the client leaves, while /health, /metrics and
// the rest answer as usual: the engine is wedged, the API server is not.
// HangBeforeHeaders(false) lets the held requests go with a 503, and new
// ones are served again.
func (r *Replica) HangBeforeHeaders(on bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case on && r.hang == nil:
		r.hang = make(chan struct{})
	case !on && r.hang != nil:
		close(r.hang)
		r.hang = nil
	}
}

// DieMidResponse(n) makes every successful generation response from now
// on end as a process dying mid-way would: a stream after its first n
// events (data lines), a non-streamed body after its headers and half of
// it, and then the connection is closed with no chunked terminator, as
// if killed. A negative n serves whole responses again.
func (r *Replica) DieMidResponse(n int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.dieAfter = n
}

// hung holds a generation request while HangBeforeHeaders is on; it
// reports whether it did (the request is then answered or abandoned).
func (r *Replica) hung(ctx context.Context, w http.ResponseWriter) bool {
	r.mu.Lock()
	ch := r.hang
	r.mu.Unlock()
	if ch == nil {
		return false
	}
	select {
	case <-ctx.Done():
	case <-ch:
		writeError(w, &apiError{code: http.StatusServiceUnavailable, msg: "engine released from hang"})
	}
	return true
}

// dieAt is the events a stream sends before its connection is cut (-1:
// it is not).
func (r *Replica) dieAt() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.dieAfter
}

// die closes the response's connection without ending the response: what
// was written so far is flushed first, so the client sees exactly that
// and then the connection gone.
func die(w http.ResponseWriter) {
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	_ = conn.Close()
}
