package store

// Admission in Redis: one queue per model in the model's slot, shared by
// every pod (lua/admit.lua and the scripts that include it). A booking
// under admission (kvroute.Lease.Admit) is made only on a replica with
// room and only when nothing is queued before it; a request that cannot
// be booked is queued (Enqueue); capacity freed by a release, a first
// token, a sweep or a pod's beat (Kick) grants the next queued request a
// seat on a replica with room, and tells its pod on the channel
// kvr:grant:<pod> (Grants); the pod's booking then takes the seat.

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/redis/go-redis/v9"
)

// admitArg is a booking's admission argument: "1:<now ms>" under
// admission, by the store's clock, which every admission script reads
// time by (lua/admit.lua).
func (s *Store) admitArg(l kvroute.Lease) string {
	if l.Admit {
		return "1:" + s.nowMs()
	}
	return "0"
}

func (s *Store) nowMs() string { return strconv.FormatInt(ms(s.now()), 10) }

// capFields returns the capacity as the cap hash's fields (admit.lua).
func capFields(c kvroute.Capacity) []any {
	bs := int64(c.BlockSize)
	if bs <= 0 {
		bs = 16
	}
	grant := c.GrantTTL
	if grant <= 0 {
		grant = 2 * time.Second
	}
	sat := "0"
	if c.StaleSaturated {
		sat = "1"
	}
	out := []any{"#", fmt.Sprintf("%d,%d,%s,%d", max(c.MaxInFlight, 0), c.StaleAfter.Milliseconds(), sat, grant.Milliseconds())}
	for r, l := range c.Replicas {
		blocks := (l.MaxPrefillTokens + bs - 1) / bs
		out = append(out, r, fmt.Sprintf("%d,%d,%d,%s", l.MaxRequests, blocks, l.MaxWaiting,
			strconv.FormatFloat(math.Min(math.Max(l.MaxKVUsage, 0), 1), 'f', -1, 64)))
	}
	return out
}

// SetCapacity replaces the model's fleet description, atomically.
func (s *Store) SetCapacity(ctx context.Context, model string, c kvroute.Capacity) error {
	key := prefix(model) + "cap"
	_, err := s.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, key)
		p.HSet(ctx, key, capFields(c)...)
		return nil
	})
	return wrap("set capacity", err)
}

// Enqueue queues t (its RequestID minted for t.Model) until a replica has
// room, and dispatches at once: the answer is Granted (a seat set aside
// on Admission.Replica) when room was there, Queued with its position,
// or Shed with the reason. hold is how long the ticket stays queued
// unless its pod renews it (Kick): a pod that dies takes its tickets with
// it within hold.
func (s *Store) Enqueue(ctx context.Context, t kvroute.Ticket, hold time.Duration, lim kvroute.QueueLimits) (kvroute.Admission, error) {
	if strings.ContainsAny(t.Pod+t.Tenant, "|") || t.RequestID == "" {
		return kvroute.Admission{}, fmt.Errorf("store: enqueue: %w", &kvroute.FieldError{Field: "tenant", Msg: "must not contain |"})
	}
	v, err := s.evalBatched(ctx, t.Model, scriptEnqueue, leaseKeys(t.Model), t.RequestID, t.Pod,
		strconv.Itoa(t.Priority), t.Tenant, strconv.FormatInt(max(t.Cost, 1), 10),
		strconv.FormatInt(ms(t.Deadline), 10), strconv.FormatInt(hold.Milliseconds(), 10),
		strconv.Itoa(lim.Queue), strconv.Itoa(lim.Band), tenantArg(lim), s.nowMs()).Slice()
	if err != nil {
		return kvroute.Admission{}, wrap("enqueue", err)
	}
	switch asInt(v[0]) {
	case 0:
		return kvroute.Admission{Status: kvroute.Queued, Position: int(asInt(v[1]))}, nil
	case 1:
		r, _ := v[1].(string)
		return kvroute.Admission{Status: kvroute.Granted, Replica: r}, nil
	case 2:
		r, _ := v[1].(string)
		return kvroute.Admission{Status: kvroute.Shed, Reason: r}, nil
	}
	return kvroute.Admission{}, fmt.Errorf("store: enqueue: %w", ErrAlreadyQueued)
}

// tenantArg is enqueue.lua's tenant limit: "f" for the fair share.
func tenantArg(l kvroute.QueueLimits) string {
	if l.FairShare {
		return "f"
	}
	return strconv.Itoa(l.Tenant)
}

// ErrAlreadyQueued is Enqueue's answer for a request id that is queued,
// or holds a seat or a lease, already.
var ErrAlreadyQueued = fmt.Errorf("the request is already queued or booked")

// Dequeue takes a request out of admission (its client left, its wait ran
// out): a queued ticket leaves the queue (1); a seat granted to it is
// given back, and admits the next (2); 0 when it held neither.
func (s *Store) Dequeue(ctx context.Context, requestID string) (int, error) {
	model, ok := RequestModel(requestID)
	if !ok {
		return 0, nil
	}
	n, err := s.evalBatched(ctx, model, scriptDequeue, leaseKeys(model), requestID, s.nowMs()).Int()
	return n, wrap("dequeue", err)
}

// Kick is a pod's beat for one model: it renews the hold of the pod's
// tickets ids, dispatches what capacity allows, and answers the model's
// queue depth and each ticket's state (a grant whose message was lost is
// found here).
func (s *Store) Kick(ctx context.Context, model string, hold time.Duration, ids []string) (int, []kvroute.TicketState, error) {
	args := make([]any, 0, 2+len(ids))
	args = append(args, s.nowMs(), strconv.FormatInt(hold.Milliseconds(), 10))
	for _, id := range ids {
		args = append(args, id)
	}
	v, err := s.evalBatched(ctx, model, scriptKick, leaseKeys(model), args...).Slice()
	if err != nil {
		return 0, nil, wrap("kick", err)
	}
	if len(v) != 1+len(ids) {
		return 0, nil, fmt.Errorf("store: kick: unexpected reply of %d values", len(v))
	}
	out := make([]kvroute.TicketState, len(ids))
	for i := range ids {
		switch x := v[1+i].(type) {
		case string:
			out[i].Replica = x
		case int64:
			out[i].Queued = x == 1
		}
	}
	return int(asInt(v[0])), out, nil
}

// QueueDepth is the model's queued requests, as KEDA's redis scaler reads
// it (LLEN of the depth list).
func (s *Store) QueueDepth(ctx context.Context, model string) (int64, error) {
	n, err := s.c.LLen(ctx, depthKey(model)).Result()
	return n, wrap("queue depth", err)
}

// Grants delivers the grants for pod's requests until ctx ends. Redis
// Pub/Sub delivers at most once: a pod also learns its grants from Kick.
func (s *Store) Grants(ctx context.Context, pod string) (<-chan kvroute.Grant, error) {
	sub := s.c.Subscribe(ctx, "kvr:grant:"+pod)
	if _, err := sub.Receive(ctx); err != nil {
		_ = sub.Close()
		return nil, wrap("subscribe", err)
	}
	out := make(chan kvroute.Grant, 256)
	go func() {
		defer close(out)
		defer sub.Close()
		ch := sub.Channel()
		for {
			select {
			case <-ctx.Done():
				return
			case m, ok := <-ch:
				if !ok {
					return
				}
				if g, ok := parseGrant(m.Payload); ok {
					select {
					case out <- g:
					case <-ctx.Done():
						return
					}
				}
			}
		}
	}()
	return out, nil
}

// parseGrant reads admit.lua's message "id replica ms".
func parseGrant(p string) (kvroute.Grant, bool) {
	f := strings.Fields(p)
	if len(f) != 3 {
		return kvroute.Grant{}, false
	}
	at, err := strconv.ParseInt(f[2], 10, 64)
	if err != nil {
		return kvroute.Grant{}, false
	}
	return kvroute.Grant{RequestID: f[0], Replica: f[1], At: time.UnixMilli(at)}, true
}

// Pods counts the serving pods sharing the queue: the channels with a
// subscriber among kvr:grant:* (each pod subscribes to its own). Under
// Cluster it is the pods connected to the node asked.
func (s *Store) Pods(ctx context.Context) (int, error) {
	ch, err := s.c.PubSubChannels(ctx, "kvr:grant:*").Result()
	return len(ch), wrap("pods", err)
}
