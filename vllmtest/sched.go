package vllmtest

import (
	"context"
	"fmt"
	"net/http"
)

// The scheduling policies of Config.SchedulingPolicy, named as vllm
// serve's --scheduling-policy names them.
const (
	// PolicyFCFS runs waiting requests in arrival order and refuses a
	// request with a non-zero priority: vLLM's default.
	PolicyFCFS = "fcfs"
	// PolicyPriority runs waiting requests in (priority, arrival) order,
	// lowest first.
	PolicyPriority = "priority"
)

// waiter is one request waiting for a running slot. ready is closed when
// the scheduler grants it one; granted records that under Replica.mu, so
// that a request whose client leaves at the same moment can give the slot
// back instead of leaking it.
type waiter struct {
	priority int
	arrival  uint64
	ready    chan struct{}
	granted  bool
}

// checkPriority refuses a non-zero priority unless the replica schedules
// by priority, with the message vLLM's input processor raises
// (vllm/v1/engine/input_processor.py, processor.py in older releases:
// `Got priority {priority} but Priority scheduling is not enabled.`), which
// its OpenAI server answers as a 400 BadRequestError (writeError's shape,
// vllm/entrypoints/openai/protocol.py's ErrorResponse).
func (r *Replica) checkPriority(priority int) error {
	if priority != 0 && r.cfg.SchedulingPolicy != PolicyPriority {
		return &apiError{code: http.StatusBadRequest,
			msg: fmt.Sprintf("Got priority %d but Priority scheduling is not enabled.", priority)}
	}
	return nil
}

// schedule waits for a running slot, counting the request as waiting
// meanwhile, and returns the function that frees the slot. A request
// runs at once only when a slot is free and nobody waits, so that a
// newcomer never overtakes the queue; the queue's order is the policy's
// (next).
func (r *Replica) schedule(ctx context.Context, priority int) (release func(), err error) {
	r.mu.Lock()
	if r.cfg.MaxRunning == 0 || (r.running < r.cfg.MaxRunning && len(r.queue) == 0) {
		r.running++
		r.mu.Unlock()
		return r.release, nil
	}
	r.arrivals++
	w := &waiter{priority: priority, arrival: r.arrivals, ready: make(chan struct{})}
	r.queue = append(r.queue, w)
	r.waiting++
	r.mu.Unlock()

	select {
	case <-w.ready:
		return r.release, nil
	case <-ctx.Done():
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if w.granted {
		// Granted as the client left: hand the slot on.
		r.running--
		r.grantLocked()
	} else {
		r.dropLocked(w)
	}
	return nil, fmt.Errorf("replica: schedule: %w", ctx.Err())
}

// release frees a running slot and hands it to the next waiting request.
func (r *Replica) release() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.running--
	r.grantLocked()
}

// grantLocked moves waiting requests to running while slots are free.
func (r *Replica) grantLocked() {
	for len(r.queue) > 0 && (r.cfg.MaxRunning == 0 || r.running < r.cfg.MaxRunning) {
		w := r.queue[r.nextLocked()]
		r.dropLocked(w)
		w.granted = true
		r.running++
		close(w.ready)
	}
}

// nextLocked is the index of the waiting request to run next: the oldest
// under fcfs; under priority the lowest priority value, the oldest among
// equals, as vLLM's priority scheduler orders its waiting queue by
// (priority, arrival_time).
func (r *Replica) nextLocked() int {
	best := 0
	for i, w := range r.queue[1:] {
		b := r.queue[best]
		if r.cfg.SchedulingPolicy == PolicyPriority && w.priority != b.priority {
			if w.priority < b.priority {
				best = i + 1
			}
			continue
		}
		if w.arrival < b.arrival {
			best = i + 1
		}
	}
	return best
}

// dropLocked removes w from the waiting queue.
func (r *Replica) dropLocked(w *waiter) {
	for i, q := range r.queue {
		if q == w {
			r.queue = append(r.queue[:i], r.queue[i+1:]...)
			r.waiting--
			return
		}
	}
}
