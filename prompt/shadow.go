package prompt

import (
	"context"
	"time"

	"github.com/kvroute/kvroute"
)

// shadowTimeout bounds one shadow comparison: it runs beside the request,
// never in its way.
const shadowTimeout = 5 * time.Second

// shadowCompare tokenizes req remotely in the background and compares
// with what kvroute computed. A mismatch means kvroute's keys for this
// model miss wherever the difference starts: it is counted per model and
// logged with the first differing position.
func (r *Resolver) shadowCompare(req kvroute.TokenizeRequest, local []uint32) {
	select {
	case r.shadow <- struct{}{}:
	default:
		r.m.shadow.WithLabelValues(req.Model, "skipped").Inc()
		return
	}
	r.wg.Go(func() {
		defer func() { <-r.shadow }()
		ctx, cancel := context.WithTimeout(context.Background(), shadowTimeout)
		defer cancel()
		remote, err := r.cfg.Remote.Tokenize(ctx, req)
		if err != nil {
			r.m.shadow.WithLabelValues(req.Model, "error").Inc()
			r.log.Warn("shadow tokenization failed", "model", req.Model, "err", err)
			return
		}
		at := FirstDifference(local, remote)
		if at < 0 {
			r.m.shadow.WithLabelValues(req.Model, "match").Inc()
			return
		}
		r.m.shadow.WithLabelValues(req.Model, "mismatch").Inc()
		r.stopForwarding(req.Model, at, local, remote)
		r.log.Error("tokenizer mismatch: kvroute's tokens differ from the engine's, so this model's prompts miss the cache from there on",
			"model", req.Model, "chat", req.Chat(), "position", at,
			"local_tokens", len(local), "remote_tokens", len(remote),
			"local", window(local, at), "remote", window(remote, at))
	})
}

// FirstDifference is the first index where a and b differ, len of the
// shorter when one is a prefix of the other, or -1 when they are equal.
func FirstDifference(a, b []uint32) int {
	n := min(len(a), len(b))
	for i := range n {
		if a[i] != b[i] {
			return i
		}
	}
	if len(a) != len(b) {
		return n
	}
	return -1
}

// window is a few ids around position at, for a log line.
func window(ids []uint32, at int) []uint32 {
	lo, hi := max(at-3, 0), min(at+5, len(ids))
	if lo >= hi {
		return nil
	}
	return ids[lo:hi]
}
