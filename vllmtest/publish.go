package vllmtest

import (
	"context"
	"encoding/binary"
	"time"

	"github.com/go-zeromq/zmq4"
)

// batch is one published or buffered event batch.
type batch struct {
	seq     uint64
	payload []byte
}

// endSeq is the sequence number of the replay end marker.
const endSeq = ^uint64(0)

func seqBytes(seq uint64) []byte {
	b := make([]byte, 8)
	binary.BigEndian.PutUint64(b, seq)
	return b
}

// emitLocked gives events the next sequence number, keeps the batch for
// replay and queues it for publishing (or drops it from the wire when
// DropNext asked for a gap). r.mu must be held.
func (r *Replica) emitLocked(events ...event) {
	if len(events) == 0 {
		return
	}
	ts := float64(r.cfg.Now().UnixNano()) / 1e9
	payload, err := encodeBatch(r.cfg.EventEncoding, ts, events, r.cfg.DataParallelRank)
	if err != nil {
		// Unreachable with the types encoded here; keep the seq gap
		// visible rather than silently reusing the number.
		r.log.Error("encode batch", "err", err)
	}
	b := batch{seq: r.seq, payload: payload}
	r.seq++
	r.replay = appendBounded(r.replay, b, r.cfg.ReplayBuffer)
	if r.dropNext > 0 {
		r.dropNext--
		return
	}
	r.pending = appendBounded(r.pending, b, r.cfg.ReplayBuffer)
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// appendBounded appends b and forgets the oldest entries beyond max.
func appendBounded(bs []batch, b batch, max int) []batch {
	bs = append(bs, b)
	if len(bs) > max {
		n := copy(bs, bs[len(bs)-max:])
		clear(bs[n:])
		bs = bs[:n]
	}
	return bs
}

// publishLoop is the only writer of the PUB socket, so batches leave in
// sequence order. A stall holds them back until it ends.
func (r *Replica) publishLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.notify:
		}
		for {
			r.mu.Lock()
			wait := time.Until(r.stallUntil)
			if wait > 0 {
				r.mu.Unlock()
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				case <-r.notify: // Restart or a new Stall changed the deadline.
					t.Stop()
				}
				continue
			}
			out := r.pending
			r.pending = nil
			r.mu.Unlock()
			if len(out) == 0 {
				break
			}
			for _, b := range out {
				msg := zmq4.NewMsgFrom([]byte(r.cfg.Topic), seqBytes(b.seq), b.payload)
				if err := r.pub.Send(msg); err != nil {
					if ctx.Err() != nil {
						return
					}
					r.log.Warn("publish", "seq", b.seq, "err", err)
				}
			}
		}
	}
}

// replayLoop answers DEALER requests ["", seq8] on the ROUTER socket.
func (r *Replica) replayLoop(ctx context.Context) {
	for {
		msg, err := r.router.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			r.log.Debug("replay recv", "err", err)
			select {
			case <-ctx.Done():
				return
			case <-time.After(10 * time.Millisecond):
			}
			continue
		}
		// [identity, "", seq8]; anything else is malformed and, as in vLLM,
		// gets no answer at all.
		if len(msg.Frames) != 3 || len(msg.Frames[1]) != 0 || len(msg.Frames[2]) != 8 {
			r.log.Warn("malformed replay request", "frames", len(msg.Frames))
			continue
		}
		id := msg.Frames[0]
		from := binary.BigEndian.Uint64(msg.Frames[2])
		r.mu.Lock()
		var bs []batch
		for _, b := range r.replay {
			if b.seq >= from {
				bs = append(bs, b)
			}
		}
		r.mu.Unlock()
		for _, b := range bs {
			if err := r.router.Send(r.replayMsg(id, seqBytes(b.seq), b.payload)); err != nil {
				r.log.Warn("replay send", "err", err)
				break
			}
		}
		if err := r.router.Send(r.replayMsg(id, seqBytes(endSeq), nil)); err != nil {
			r.log.Warn("replay send end", "err", err)
		}
	}
}

// replayMsg builds one reply to the DEALER with identity id, in the layout
// Config.ReplayWithoutTopic chooses; as in vLLM, the end marker's topic
// frame is empty.
func (r *Replica) replayMsg(id, seq, payload []byte) zmq4.Msg {
	if r.cfg.ReplayWithoutTopic {
		return zmq4.NewMsgFrom(id, []byte{}, seq, nonNil(payload))
	}
	topic := []byte(r.cfg.Topic)
	if binary.BigEndian.Uint64(seq) == endSeq {
		topic = []byte{}
	}
	return zmq4.NewMsgFrom(id, []byte{}, topic, seq, nonNil(payload))
}

// nonNil turns the end marker's missing payload into an empty frame.
func nonNil(b []byte) []byte {
	if b == nil {
		return []byte{}
	}
	return b
}
