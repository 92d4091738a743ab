package api

import (
	"bytes"
	"encoding/json"
	"io"
)

// usage is what a replica's response says of its prompt: vLLM reports
// prompt_tokens_details.cached_tokens (with --enable-prompt-tokens-details)
// in a completion's usage, and in a stream's last chunk when
// stream_options.include_usage is set.
type usage struct {
	PromptTokens int
	// Cached is the prompt tokens served from the prefix cache; Reported
	// is false when the replica does not say.
	Cached   int
	Reported bool
}

// maxUsageScan bounds what a non-streamed body is buffered for its usage;
// a larger body is passed through unread.
const maxUsageScan = 4 << 20

// usageTap passes a replica's response through and reads its usage on the
// way. For a stream it works event by event (SSE events end with a blank
// line), so every event reaches the client as soon as it is whole, and it
// can drop the usage-only chunk that kvroute asked for and the client did
// not.
type usageTap struct {
	src     io.ReadCloser
	sse     bool
	strip   bool
	onUsage func(usage)
	done    bool // onUsage called
	// pending holds a stream's incomplete event; out what is ready to
	// return; whole a non-streamed body so far.
	pending []byte
	out     []byte
	whole   []byte
	tooBig  bool
	eof     error
	buf     [32 << 10]byte
}

func newUsageTap(src io.ReadCloser, sse, strip bool, onUsage func(usage)) *usageTap {
	return &usageTap{src: src, sse: sse, strip: strip && sse, onUsage: onUsage}
}

func (t *usageTap) Read(p []byte) (int, error) {
	for len(t.out) == 0 && t.eof == nil {
		n, err := t.src.Read(t.buf[:])
		t.take(t.buf[:n])
		if err != nil {
			t.eof = err
			t.finish()
		}
	}
	if len(t.out) > 0 {
		n := copy(p, t.out)
		t.out = t.out[n:]
		if len(t.out) == 0 && t.eof != nil {
			// The last bytes and the end together, as the source gave
			// them: the proxy then ends the request (and releases its
			// booking) before the client has read its last byte.
			return n, t.eof
		}
		return n, nil
	}
	return 0, t.eof
}

func (t *usageTap) Close() error { return t.src.Close() }

// take processes the bytes just read.
func (t *usageTap) take(b []byte) {
	if len(b) == 0 {
		return
	}
	if !t.sse {
		t.out = append(t.out, b...)
		if !t.tooBig {
			if len(t.whole)+len(b) > maxUsageScan {
				t.tooBig, t.whole = true, nil
			} else {
				t.whole = append(t.whole, b...)
			}
		}
		return
	}
	t.pending = append(t.pending, b...)
	for {
		i := eventEnd(t.pending)
		if i < 0 {
			return
		}
		ev := t.pending[:i]
		if !t.event(ev) {
			t.out = append(t.out, ev...)
		}
		t.pending = t.pending[i:]
	}
}

// finish flushes what is left at the end of the body.
func (t *usageTap) finish() {
	if t.sse {
		t.out = append(t.out, t.pending...)
		t.pending = nil
		return
	}
	if len(t.whole) > 0 {
		if u, ok := parseUsage(t.whole); ok {
			t.report(u)
		}
	}
	t.whole = nil
}

// event reads one SSE event's usage and reports whether to drop it.
func (t *usageTap) event(ev []byte) (drop bool) {
	data, ok := bytes.CutPrefix(bytes.TrimLeft(ev, "\r\n"), []byte("data:"))
	if !ok || !bytes.Contains(data, []byte(`"usage"`)) {
		return false
	}
	data = bytes.TrimSpace(data)
	var chunk struct {
		Choices json.RawMessage `json:"choices"`
	}
	u, ok := parseUsage(data)
	if !ok {
		return false
	}
	t.report(u)
	if t.strip && json.Unmarshal(data, &chunk) == nil && bytes.Equal(bytes.TrimSpace(chunk.Choices), []byte("[]")) {
		return true
	}
	return false
}

func (t *usageTap) report(u usage) {
	if t.done {
		return
	}
	t.done = true
	t.onUsage(u)
}

// eventEnd is the index just past the first complete SSE event in b (its
// terminating blank line included), or -1.
func eventEnd(b []byte) int {
	for i := 0; i+1 < len(b); i++ {
		if b[i] != '\n' {
			continue
		}
		switch {
		case b[i+1] == '\n':
			return i + 2
		case b[i+1] == '\r' && i+2 < len(b) && b[i+2] == '\n':
			return i + 3
		}
	}
	return -1
}

// parseUsage reads the usage object of a completion or chunk, if any.
func parseUsage(b []byte) (usage, bool) {
	var body struct {
		Usage *struct {
			PromptTokens        int `json:"prompt_tokens"`
			PromptTokensDetails *struct {
				CachedTokens *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(b, &body) != nil || body.Usage == nil {
		return usage{}, false
	}
	u := usage{PromptTokens: body.Usage.PromptTokens}
	if d := body.Usage.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		u.Cached, u.Reported = *d.CachedTokens, true
	}
	return u, true
}
