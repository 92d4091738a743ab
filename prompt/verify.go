package prompt

import (
	"context"
	"sync"

	"github.com/kvroute/kvroute"
)

// Forwarding a text prompt as kvroute's own token ids makes the engine
// generate from those ids, whatever it would have made of the text: a
// tokenizer.json from another revision of the model (one merge, one added
// token) would change what is generated, silently. So a model's ids are
// forwarded only once its local tokenizer has been shown to agree with
// its replicas: the first VerifyMatches text tokenizations are also sent
// to a replica (Remote, vLLM's /tokenize) and compared, the request in
// the meantime forwarded as the client sent it. The first mismatch, then
// or later in a shadow comparison, stops forwarding for the model until
// the process restarts (an ERROR line and kvroute_token_forwarding_checks_total
// say so); the ids still key the cache lookup, whose misses the shadow
// comparison and the believed-versus-served counters show.

// DefaultVerifyMatches is how many agreeing tokenizations a model's local
// tokenizer needs before its ids are forwarded.
const DefaultVerifyMatches = 3

// forwardState is one local model's verification.
type forwardState struct {
	matches, inFlight int
	stopped           bool
}

// forwarding holds every local model's verification.
type forwarding struct {
	mu     sync.Mutex
	models map[string]*forwardState
}

func (f *forwarding) state(model string) *forwardState {
	if f.models == nil {
		f.models = map[string]*forwardState{}
	}
	st := f.models[model]
	if st == nil {
		st = &forwardState{}
		f.models[model] = st
	}
	return st
}

// forwardable reports whether the ids of req, a text prompt tokenized
// locally into local, may be forwarded; while its model is not verified
// yet it starts a comparison (at most the matches still needed in
// flight) and answers false.
func (r *Resolver) forwardable(req kvroute.TokenizeRequest, local []uint32) bool {
	need := r.cfg.VerifyMatches
	switch {
	case req.Chat():
		return false // a chat is forwarded as messages
	case need < 0:
		return true
	case r.cfg.Remote == nil:
		return false // nothing to verify against
	}
	r.fwd.mu.Lock()
	st := r.fwd.state(req.Model)
	ok, check := !st.stopped && st.matches >= need, !st.stopped && st.matches+st.inFlight < need
	if check {
		st.inFlight++
	}
	r.fwd.mu.Unlock()
	if check {
		r.wg.Go(func() { r.verify(req, local) })
	}
	return ok
}

// verify compares one tokenization with a replica's and records the
// outcome.
func (r *Resolver) verify(req kvroute.TokenizeRequest, local []uint32) {
	ctx, cancel := context.WithTimeout(context.Background(), shadowTimeout)
	defer cancel()
	remote, err := r.cfg.Remote.Tokenize(ctx, req)
	r.fwd.mu.Lock()
	st := r.fwd.state(req.Model)
	st.inFlight--
	at := FirstDifference(local, remote)
	switch {
	case err != nil:
		// Not counted against the tokenizer: a later request checks again.
	case at < 0:
		st.matches++
		if st.matches == r.cfg.VerifyMatches && !st.stopped {
			r.log.Info("token forwarding on: the local tokenizer agrees with the engine's", "model", req.Model, "checks", st.matches)
		}
	}
	r.fwd.mu.Unlock()
	switch {
	case err != nil:
		r.m.forwardChecks.WithLabelValues(req.Model, "error").Inc()
		r.log.Warn("token forwarding check failed; the prompt goes as text", "model", req.Model, "err", err)
	case at < 0:
		r.m.forwardChecks.WithLabelValues(req.Model, "match").Inc()
	default:
		r.m.forwardChecks.WithLabelValues(req.Model, "mismatch").Inc()
		r.stopForwarding(req.Model, at, local, remote)
	}
}

// stopForwarding turns forwarding off for model after a mismatch at
// position at, and says so once.
func (r *Resolver) stopForwarding(model string, at int, local, remote []uint32) {
	r.fwd.mu.Lock()
	st := r.fwd.state(model)
	was := st.stopped
	st.stopped = true
	r.fwd.mu.Unlock()
	if was || r.cfg.VerifyMatches < 0 {
		return
	}
	r.log.Error("token forwarding off: kvroute's tokenizer differs from the engine's, so this model's text prompts go to its replicas as sent",
		"model", model, "position", at, "local", window(local, at), "remote", window(remote, at))
}

// forwardingState is model's state for the metrics: 1 forwarding, 0
// verifying, -1 stopped.
func (r *Resolver) forwardingState(model string) int64 {
	if r.cfg.VerifyMatches < 0 {
		return 1
	}
	r.fwd.mu.Lock()
	defer r.fwd.mu.Unlock()
	st := r.fwd.state(model)
	switch {
	case st.stopped:
		return -1
	case st.matches >= r.cfg.VerifyMatches && r.cfg.Remote != nil:
		return 1
	}
	return 0
}
