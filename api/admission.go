package api

// The admission edge: what a request says about its queueing (priority,
// how long it may wait, whom it is charged to) and what its answer says
// back (how long it waited). The queue itself is the router's.

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/strictjson"
	"github.com/kvroute/kvroute/router"
)

// Headers of admission. The OpenAI endpoints read the priority and the
// wait from headers because their bodies are vLLM's (vLLM's own priority
// field wins over the header); every answer of a request that waited
// says how long.
const (
	// HeaderPriority is a proxied request's priority when its body has
	// no priority field: an integer, lower is admitted first, 0 default.
	HeaderPriority = "X-Kvroute-Priority"
	// HeaderMaxWaitMs bounds a proxied request's wait for admission, in
	// milliseconds (0: shed at once rather than wait); absent, it waits
	// up to the queue's TTL.
	HeaderMaxWaitMs = "X-Kvroute-Max-Wait-Ms"
	// HeaderQueuedMs is how long the request waited for admission, in
	// milliseconds (rounded up), set only when it waited.
	HeaderQueuedMs = "X-Kvroute-Queued-Ms"
)

// Bounds of the admission inputs. A priority is a band of the shared
// queue, which the store's scripts keep as a Lua number: the 32-bit
// range keeps it exact there and is wider than any use of vLLM's field.
// A wait longer than a day is no wait a client means (the queue's TTL
// bounds it anyway), and the bound keeps it a Duration.
const (
	minPriority   = math.MinInt32
	maxPriority   = math.MaxInt32
	maxMaxWaitMS  = int64(24 * time.Hour / time.Millisecond)
	priorityField = "priority"
)

// checkPriority bounds a priority given in field.
func checkPriority(field string, p int64) error {
	if p < minPriority || p > maxPriority {
		return &kvroute.FieldError{Field: field, Msg: fmt.Sprintf("must be an integer in [%d, %d], got %d", minPriority, maxPriority, p)}
	}
	return nil
}

// maxWait is a wait in milliseconds given in field, as the router's
// MaxWait.
func maxWait(field string, ms int64) (time.Duration, error) {
	if ms < 0 || ms > maxMaxWaitMS {
		return 0, &kvroute.FieldError{Field: field, Msg: fmt.Sprintf("must be an integer in [0, %d] (milliseconds), got %d", maxMaxWaitMS, ms)}
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// routeAdmission sets req's priority and wait from a /v1/route body:
// absent, priority 0 and no wait (a decision client is answered at once,
// 429 with its position, and decides itself whether to retry).
func routeAdmission(req *router.Request, b RouteRequest) error {
	if b.Priority != nil {
		if err := checkPriority(priorityField, *b.Priority); err != nil {
			return err
		}
		req.Priority = int(*b.Priority)
	}
	if b.MaxWaitMS != nil {
		d, err := maxWait("max_wait_ms", *b.MaxWaitMS)
		if err != nil {
			return err
		}
		req.MaxWait = d
	}
	return nil
}

// proxyAdmission sets req's priority and wait from an OpenAI request: the
// priority from the body's vLLM field or else HeaderPriority, the wait
// from HeaderMaxWaitMs or else up to the queue's TTL (an OpenAI client
// has no way to be told to come back but an error, which most SDKs retry
// blindly, so it waits by default).
func proxyAdmission(req *router.Request, r *http.Request, oa *openAIRequest) error {
	req.MaxWait = -1
	if present(oa.Priority) {
		p, err := bodyPriority(oa.Priority)
		if err != nil {
			return err
		}
		req.Priority = p
	} else if v, ok, err := intHeader(r, HeaderPriority); err != nil {
		return err
	} else if ok {
		if err := checkPriority(HeaderPriority, v); err != nil {
			return err
		}
		req.Priority = int(v)
	}
	if v, ok, err := intHeader(r, HeaderMaxWaitMs); err != nil {
		return err
	} else if ok {
		if req.MaxWait, err = maxWait(HeaderMaxWaitMs, v); err != nil {
			return err
		}
	}
	return nil
}

// bodyPriority is vLLM's priority field of a proxied body, which must be
// a JSON integer: vLLM's field is an int, and a priority that the router
// and the engine read differently would order the queue one way and the
// engine another.
func bodyPriority(raw json.RawMessage) (int, error) {
	b := strictjson.TrimSpace(raw)
	v, err := strconv.ParseInt(string(b), 10, 64)
	if err != nil {
		return 0, &kvroute.FieldError{Field: priorityField, Msg: "must be an integer, got " + truncate(b)}
	}
	if err := checkPriority(priorityField, v); err != nil {
		return 0, err
	}
	return int(v), nil
}

// intHeader is an integer header, once at most; ok is false when absent.
func intHeader(r *http.Request, name string) (v int64, ok bool, err error) {
	vals := r.Header.Values(name)
	switch len(vals) {
	case 0:
		return 0, false, nil
	case 1:
	default:
		return 0, false, &kvroute.FieldError{Field: name, Msg: "is given more than once"}
	}
	v, err = strconv.ParseInt(vals[0], 10, 64)
	if err != nil {
		return 0, false, &kvroute.FieldError{Field: name, Msg: "must be an integer, got " + strconv.Quote(truncate([]byte(vals[0])))}
	}
	return v, true, nil
}

// decisionTimeout is how long deciding req may take: Timeout, which
// bounds the work, plus the wait it asked for (up to the queue's TTL
// when it asked for no bound), which is not work.
func (s *Server) decisionTimeout(req router.Request) time.Duration {
	wait := req.MaxWait
	if wait < 0 || wait > s.cfg.MaxQueueWait {
		wait = s.cfg.MaxQueueWait
	}
	return s.cfg.Timeout + wait
}

// queuedMS is a wait in whole milliseconds, rounded up so that a wait of
// a few microseconds still reads as one: 0 only when it did not wait.
func queuedMS(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}
