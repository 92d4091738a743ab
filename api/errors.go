package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
)

// Error codes are part of the API: clients switch on them, so they never
// change meaning once shipped.
const (
	CodeInvalidInput    = "invalid_input"
	CodeInvalidJSON     = "invalid_json"
	CodeBodyTooLarge    = "body_too_large"
	CodeNotFound        = "not_found"
	CodeModelNotFound   = "model_not_found"
	CodeReplicaNotFound = "replica_not_found"
	CodeNoReplica       = "no_replica"
	CodeUnavailable     = "unavailable"
	CodeNotReady        = "not_ready"
	CodeTimeout         = "timeout"
	CodeCanceled        = "canceled"
	CodeUpstream        = "upstream_error"
	CodeMethod          = "method_not_allowed"
	CodeInternal        = "internal"
	CodeUnauthorized    = "unauthorized"
	// CodeOverloaded is a request admission shed (429): the model's
	// fleet is at capacity and the request could not wait; Reason says
	// why (kvroute.Shed*: queue_full, band_full, tenant_full, ttl,
	// no_wait, pod_limit).
	CodeOverloaded     = "overloaded"
	statusClientClosed = 499
)

// ErrorBody is the JSON every error answer carries, so that clients parse
// one shape whatever went wrong.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail says what went wrong; Field names the request field at fault
// when there is one, so a client can point at it without parsing Message.
type ErrorDetail struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
	// Reason and Position describe a shed request (429 overloaded, or
	// 503 no_replica after the cold-start wait): why admission refused
	// it, and how many requests were queued ahead of it.
	Reason   string `json:"reason,omitempty"`
	Position *int   `json:"position,omitempty"`
}

// codedError overrides the code statusOf would derive from err, for the few
// cases where the same sentinel means different things to a client (a
// malformed body is not the same as a bad field).
type codedError struct {
	code string
	err  error
}

func (e *codedError) Error() string { return e.err.Error() }
func (e *codedError) Unwrap() error { return e.err }

func withCode(code string, err error) error { return &codedError{code: code, err: err} }

// errUpstream marks a failure to reach the chosen replica in the proxy.
var errUpstream = errors.New("upstream replica failed")

// statusOf is the one place errors become HTTP statuses. Handlers never pick
// a status for a failure themselves; they return or wrap a sentinel from the
// kvroute package or one of the router's typed errors (a request it
// refuses, a model it does not know) and let this function decide.
func statusOf(err error) (int, ErrorDetail) {
	d := ErrorDetail{Message: err.Error()}
	var (
		status int
		fe     *kvroute.FieldError
		re     *router.RequestError
		mnf    *router.ModelNotFoundError
		mbe    *http.MaxBytesError
		shed   *router.ShedError
	)
	switch {
	case errors.As(err, &shed):
		status, d = shedStatus(shed)
	case errors.As(err, &mbe):
		status, d.Code = http.StatusRequestEntityTooLarge, CodeBodyTooLarge
		d.Message = "request body is larger than the limit"
	case errors.As(err, &fe):
		status, d.Code, d.Field = http.StatusBadRequest, CodeInvalidInput, fe.Field
	case errors.As(err, &re):
		status, d.Code, d.Field = http.StatusBadRequest, CodeInvalidInput, re.Field
	case errors.As(err, &mnf):
		// An unknown model is not the same mistake as an unknown id.
		status, d.Code = http.StatusNotFound, CodeModelNotFound
	case errors.Is(err, kvroute.ErrInvalidInput):
		status, d.Code = http.StatusBadRequest, CodeInvalidInput
	case errors.Is(err, kvroute.ErrNotFound):
		status, d.Code = http.StatusNotFound, CodeNotFound
	case errors.Is(err, kvroute.ErrNoReplica):
		status, d.Code = http.StatusServiceUnavailable, CodeNoReplica
	case errors.Is(err, kvroute.ErrUnavailable):
		status, d.Code = http.StatusServiceUnavailable, CodeUnavailable
	case errors.Is(err, errUnauthorized):
		status, d.Code = http.StatusUnauthorized, CodeUnauthorized
	case errors.Is(err, errUpstream):
		status, d.Code = http.StatusBadGateway, CodeUpstream
	case errors.Is(err, context.DeadlineExceeded):
		status, d.Code = http.StatusGatewayTimeout, CodeTimeout
	case errors.Is(err, context.Canceled):
		status, d.Code = statusClientClosed, CodeCanceled
	default:
		status, d.Code = http.StatusInternalServerError, CodeInternal
		// Internal details stay in the log, not in the answer.
		d.Message = "internal error"
	}
	var ce *codedError
	if errors.As(err, &ce) {
		d.Code = ce.code
	}
	return status, d
}

// shedStatus is a shed request's answer: 503 no_replica when its model
// had no replica within the cold-start wait, else 429 overloaded. The
// message is for people; clients switch on code and reason.
func shedStatus(e *router.ShedError) (int, ErrorDetail) {
	pos := e.Position
	d := ErrorDetail{Reason: e.Reason, Position: &pos}
	if e.Reason == kvroute.ShedNoReplica {
		d.Code = CodeNoReplica
		d.Message = fmt.Sprintf("model %q has no replica ready: none came up within the cold-start wait", e.Model)
		return http.StatusServiceUnavailable, d
	}
	d.Code = CodeOverloaded
	d.Message = fmt.Sprintf("model %q is at capacity and the request was not admitted (%s; %d requests queued ahead of it): retry after the Retry-After seconds",
		e.Model, shedWhy(e.Reason), e.Position)
	return http.StatusTooManyRequests, d
}

// shedWhy is a shed reason in words.
func shedWhy(reason string) string {
	switch reason {
	case kvroute.ShedQueueFull:
		return "the model's queue is full"
	case kvroute.ShedBandFull:
		return "the queue of its priority is full"
	case kvroute.ShedTenantFull:
		return "its tenant has as many requests queued as it may"
	case kvroute.ShedTTL:
		return "it waited as long as the queue keeps a request"
	case kvroute.ShedNoWait:
		return "no replica has room and it asked not to wait"
	case kvroute.ShedPodLimit:
		return "the shared queue is unreachable and this router is at its share"
	}
	return "shed: " + reason
}

// retryAfter is the Retry-After of err's answer in whole seconds (rounded
// up, at least 1), or "" for an answer that has none. A shed request
// carries the router's estimate; every other 503 (no healthy replica,
// store down) is usually brief.
func retryAfter(err error, status int) string {
	var shed *router.ShedError
	switch {
	case errors.As(err, &shed):
		secs := int64((shed.RetryAfter + time.Second - 1) / time.Second)
		return strconv.FormatInt(max(secs, 1), 10)
	case status == http.StatusServiceUnavailable:
		return "1"
	}
	return ""
}

// writeError answers with err's status and JSON body, counts it by code and
// logs server-side failures, which the client cannot fix. On the OpenAI
// endpoints the body has OpenAI's error shape, which their SDKs parse.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	status, d := statusOf(err)
	s.m.apiError(r.Context(), d.Code)
	if status >= 500 && status != http.StatusServiceUnavailable {
		s.log.ErrorContext(r.Context(), "request failed", "path", r.URL.Path, "status", status, "err", err)
	}
	if ra := retryAfter(err, status); ra != "" {
		w.Header().Set("Retry-After", ra)
	}
	if status == http.StatusUnauthorized {
		w.Header().Set("WWW-Authenticate", authRealm)
	}
	if openAIPath(r.URL.Path) {
		writeJSON(w, status, openAIError(status, d))
		return
	}
	writeJSON(w, status, ErrorBody{Error: d})
}

// OpenAIErrorBody is the error shape of OpenAI's API, which kvroute's
// OpenAI endpoints answer with: message, type, param (the request field
// at fault, or null) and code (kvroute's error code; a shed request's is
// its reason, as OpenAI's rate limits carry theirs). A shed request's
// type is rate_limit_exceeded (429) or service_unavailable (503), and
// position is kvroute's extension, which OpenAI's SDKs ignore.
type OpenAIErrorBody struct {
	Error OpenAIErrorDetail `json:"error"`
}

// OpenAIErrorDetail is one OpenAI error.
type OpenAIErrorDetail struct {
	Message string  `json:"message"`
	Type    string  `json:"type"`
	Param   *string `json:"param"`
	Code    string  `json:"code"`
	// Position is how many requests were queued ahead of a shed one.
	Position *int `json:"position,omitempty"`
}

// openAIError is d in OpenAI's shape, typed as OpenAI types errors.
func openAIError(status int, d ErrorDetail) OpenAIErrorBody {
	e := OpenAIErrorDetail{Message: d.Message, Code: d.Code}
	if d.Field != "" {
		e.Param = &d.Field
	}
	switch {
	case d.Reason != "":
		e.Code, e.Position = d.Reason, d.Position
		e.Type = "rate_limit_exceeded"
		if status == http.StatusServiceUnavailable {
			e.Type = "service_unavailable"
		}
	case status == http.StatusUnauthorized:
		e.Type = "authentication_error"
	case status == http.StatusNotFound:
		e.Type = "not_found_error"
	case status < 500:
		e.Type = "invalid_request_error"
	default:
		e.Type = "api_error"
	}
	return OpenAIErrorBody{Error: e}
}

// openAIPath reports whether path is one of the OpenAI-compatible
// endpoints.
func openAIPath(path string) bool {
	switch path {
	case "/v1/completions", "/v1/chat/completions", "/v1/models":
		return true
	}
	return false
}
