package api

import (
	"bytes"
	"io"
	"net/http"

	"github.com/kvroute/kvroute"
)

// priorityNotEnabled is what vLLM answers (a 400) to a non-zero priority
// when it was not started with --scheduling-policy priority.
const priorityNotEnabled = "Priority scheduling is not enabled"

// maxRefusalBytes bounds how much of a 400 the proxy reads to recognise
// vLLM's refusal; vLLM's error bodies are a few hundred bytes.
const maxRefusalBytes = 64 << 10

// bodyFor is the body rep gets: with the priority field only when rep is
// registered as scheduling by priority and has not refused it.
func (p *proxyRequest) bodyFor(rep kvroute.Replica) []byte {
	if p.fw.bare != nil && !p.s.takesPriority(rep) {
		return p.fw.bare
	}
	return p.fw.body
}

// sentPriority reports whether rep was sent a body with a priority field.
func (p *proxyRequest) sentPriority(rep kvroute.Replica) bool {
	return p.fw.bare != nil && p.s.takesPriority(rep)
}

// takesPriority reports whether rep is sent a priority field: registered
// with PriorityScheduling, and not known to refuse it. A refusal is
// remembered only while the registration stays as it was refused: once
// it says PriorityScheduling false, or another URL, it is forgotten, so
// that re-registering a fixed replica is enough to try it again.
func (s *Server) takesPriority(rep kvroute.Replica) bool {
	url, refused := s.noPriority.Load(rep.ID)
	if refused && (!rep.PriorityScheduling || url != rep.URL) {
		s.noPriority.CompareAndDelete(rep.ID, url)
		refused = false
	}
	return rep.PriorityScheduling && !refused
}

// priorityRefused passes resp on, unless it is the replica refusing the
// priority it was sent (registered as scheduling by priority, it is not):
// then the request is sent once more to the same replica without the
// field, and the replica is remembered to refuse it.
func (p *proxyRequest) priorityRefused(out *http.Request, resp *http.Response) (*http.Response, error) {
	rep := p.d.Replica
	if resp.StatusCode != http.StatusBadRequest || !p.sentPriority(rep) {
		return resp, nil
	}
	head, err := io.ReadAll(io.LimitReader(resp.Body, maxRefusalBytes))
	if err != nil || !bytes.Contains(head, []byte(priorityNotEnabled)) {
		// Some other 400: the client's, passed on whole.
		resp.Body = readCloser{io.MultiReader(bytes.NewReader(head), resp.Body), resp.Body}
		return resp, nil
	}
	resp.Body.Close()
	p.s.noPriority.Store(rep.ID, rep.URL)
	p.s.log.WarnContext(out.Context(), "proxy: replica registered with priority scheduling refuses a priority; retrying without it",
		"replica", rep.ID)
	next := out.Clone(out.Context())
	setBody(next, p.fw.bare)
	return p.s.proxy.RoundTrip(next)
}

// readCloser is a body read from r and closed by c.
type readCloser struct {
	io.Reader
	io.Closer
}
