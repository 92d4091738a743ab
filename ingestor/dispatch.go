package ingestor

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor/kvevents"
)

// dispatcher is the bind mode: one SUB socket that every replica's PUB
// connects to. The topic names the replica; the dispatcher hands each
// message to the worker of the replica this ingestor owns, and drops (and
// counts) what it cannot place. A dropped batch shows up as a gap and is
// replayed.
type dispatcher struct {
	mu      sync.RWMutex
	workers map[string]*worker // by topic
	m       *Metrics
	log     *slog.Logger
}

func (d *dispatcher) set(topic string, w *worker) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if w == nil {
		delete(d.workers, topic)
		return
	}
	d.workers[topic] = w
}

func (d *dispatcher) run(ctx context.Context, s Stream) error {
	context.AfterFunc(ctx, func() { s.Close() })
	for {
		frames, err := s.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("bind recv: %w", err)
		}
		if len(frames) != 3 {
			d.m.decodeErrors.WithLabelValues(kvevents.RejectFrames).Inc()
			continue
		}
		d.mu.RLock()
		w := d.workers[string(frames[0])]
		d.mu.RUnlock()
		if w == nil {
			continue // a replica someone else owns, or unknown
		}
		select {
		case w.in <- feed{frames: frames}:
		default:
			d.m.dropped.Inc()
		}
	}
}

// topicOf is the topic a replica publishes under in bind mode: its
// configured topic, or else its id.
func topicOf(r kvroute.Replica) string {
	if r.Topic != "" {
		return r.Topic
	}
	return r.ID
}
