package store

import (
	"context"
	"fmt"
	"strconv"

	"github.com/kvroute/kvroute"
)

// RecordApprox records that keys were routed to replica, for replicas that
// publish no events: Lookup then reports them as Approx until ApproxTTL
// passes. Approximate entries never touch event-fed ones.
func (s *Store) RecordApprox(ctx context.Context, model, replica string, keys []kvroute.BlockKey) error {
	if len(keys) == 0 {
		return nil
	}
	now := s.now()
	args := []any{prefix(model), replica, strconv.FormatInt(ms(now), 10),
		strconv.FormatInt(ms(now.Add(s.approxTTL)), 10), keyBytes(keys)}
	err := scriptApprox.Run(ctx, s.c, []string{axKey(model)}, args...).Err()
	return wrap("record approx", err)
}

// sweepApproxBatch bounds the keys one sweep_approx script visits.
const sweepApproxBatch = 1000

// SweepApprox drops the model's expired approximate entries and returns how
// many (replica, block) entries it dropped. Lookup never counts an expired
// entry, so this only bounds memory; SweepExpired calls it too.
func (s *Store) SweepApprox(ctx context.Context, model string) (int, error) {
	total := 0
	now := strconv.FormatInt(ms(s.now()), 10)
	for {
		v, err := scriptSweepAx.Run(ctx, s.c, []string{axKey(model)}, prefix(model), now, sweepApproxBatch).Int64Slice()
		if err != nil {
			return total, wrap("sweep approx", err)
		}
		if len(v) != 2 {
			return total, fmt.Errorf("store: sweep approx: unexpected reply %v", v)
		}
		total += int(v[0])
		if v[1] == 0 {
			return total, nil
		}
	}
}
