package api

import (
	"context"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/kvroute/kvroute/router"
)

// HeaderDataParallelRank is vLLM's header naming the data-parallel engine
// a request must run on. The proxy sets it to a pinned decision's rank
// (and drops a client's own), and a decision's answer carries it for a
// redirected client to send.
const HeaderDataParallelRank = "X-data-parallel-rank"

// PinRecorder is what the pin check writes when a replica's engines are
// found to ignore the rank header: once, into the registry, so that every
// pod stops pinning it. *store.Store satisfies it.
type PinRecorder interface {
	// SetPinIgnored marks replica id as routed whole from now on; a
	// second call changes nothing.
	SetPinIgnored(ctx context.Context, id string) error
}

// Pin-check bounds: of the last pinWindow pinned responses that the index
// believed hit at least one block, pinMisses served none of it from
// cache. An engine that honours the header serves what its events said it
// holds (a miss is an eviction racing the request, rare: at one in twenty,
// a window trips with odds of 6 in 100,000); a server that round-robins
// over N engines misses N-1 times in N, so that even two engines trip
// within a few windows, and four within about eight responses.
const (
	pinWindow = 10
	pinMisses = 5
)

// PinCheck verifies that data-parallel replicas honour the rank they are
// pinned to (no peer does): it compares, per replica, the cached tokens
// each pinned response reports with what the index believed of the pinned
// engine. Its methods are safe for concurrent use.
type PinCheck struct {
	rec       PinRecorder
	log       *slog.Logger
	onFound   func(ctx context.Context, replica string)
	onWritten func()

	mu   sync.Mutex
	seen map[string]*pinHistory
}

// pinHistory is one replica's last outcomes, true for a miss.
type pinHistory struct {
	misses  []bool
	flagged bool
}

// NewPinCheck returns a check that records through rec (nil: nothing is
// written, the replica is unpinned by nobody), calls onFound (nil:
// nothing) once per replica it flags, and onWritten (nil: nothing) once
// the registry says so, for the caller to re-read it.
func NewPinCheck(rec PinRecorder, log *slog.Logger, onFound func(ctx context.Context, replica string), onWritten func()) *PinCheck {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &PinCheck{rec: rec, log: log, onFound: onFound, onWritten: onWritten, seen: map[string]*pinHistory{}}
}

// Observe takes one pinned response of replica: believed is the cached
// tokens the index promised of its engine, cached what the replica
// served. It reports whether this response flagged the replica.
func (c *PinCheck) Observe(replica string, believed, cached int) bool {
	if believed <= 0 {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	h := c.seen[replica]
	if h == nil {
		if len(c.seen) >= 4096 {
			clear(c.seen) // bounded: a replica churned out is forgotten
		}
		h = &pinHistory{}
		c.seen[replica] = h
	}
	if h.flagged {
		return false
	}
	h.misses = append(h.misses, cached == 0)
	if len(h.misses) > pinWindow {
		h.misses = h.misses[1:]
	}
	n := 0
	for _, m := range h.misses {
		if m {
			n++
		}
	}
	h.flagged = n >= pinMisses
	return h.flagged
}

// found records a flagged replica: a WARN line, the callback, and the
// registry write, off the response's path.
func (c *PinCheck) found(ctx context.Context, replica string) {
	c.log.WarnContext(ctx, "data-parallel replica ignores the rank header: routing it as one replica",
		"replica", replica, "header", HeaderDataParallelRank, "misses", pinMisses, "of", pinWindow)
	if c.onFound != nil {
		c.onFound(ctx, replica)
	}
	if c.rec == nil {
		return
	}
	go func() {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := c.rec.SetPinIgnored(wctx, replica); err != nil {
			c.log.WarnContext(wctx, "record pin ignored", "replica", replica, "err", err)
			c.mu.Lock()
			if h := c.seen[replica]; h != nil {
				h.flagged, h.misses = false, nil // try again on fresh evidence
			}
			c.mu.Unlock()
			return
		}
		if c.onWritten != nil {
			c.onWritten()
		}
	}()
}

// setRankHeader names d's engine in an outgoing request, or no engine for
// a decision that pinned none (the server then picks).
func setRankHeader(h http.Header, d router.Decision) {
	h.Del(HeaderDataParallelRank)
	if d.Pinned {
		h.Set(HeaderDataParallelRank, strconv.Itoa(d.DataParallelRank))
	}
}

// checkPin feeds a proxied response of a pinned decision to the pin check.
func (s *Server) checkPin(ctx context.Context, d keyed, believed int, u usage) {
	if !d.Pinned || !u.Reported || s.pins == nil {
		return
	}
	if s.pins.Observe(d.Replica.ID, believed, u.Cached) {
		s.pins.found(ctx, d.Replica.ID)
	}
}
