package store

import (
	"context"
	"fmt"
	"strconv"

	"github.com/kvroute/kvroute"
	"github.com/redis/go-redis/v9"
)

// RecordApprox records that keys were routed to replica, for replicas that
// publish no events: Lookup then reports them as Approx until ApproxTTL
// passes. Approximate entries never touch event-fed ones.
func (s *Store) RecordApprox(ctx context.Context, model, replica string, keys []kvroute.BlockKey) error {
	if len(keys) == 0 {
		return nil
	}
	now := s.now()
	exp := ms(now.Add(s.approxTTL))
	args := []any{replica, strconv.FormatInt(ms(now), 10), strconv.FormatInt(exp, 10), keyBytes(keys)}
	// The minute list is named here, as approx.lua computes it (it checks),
	// so that the script's every key is declared.
	k := libKeys(model, axKey(model), axqKey(model), axbKey(model, exp/approxMinute))
	err := scriptApprox.Run(ctx, s.c, k, args...).Err()
	return wrap("record approx", err)
}

// sweepApproxBatch bounds the keys one sweep_approx script visits.
const sweepApproxBatch = 1000

// approxMinute is the span of one approximate-entry sweep list, in ms (G
// in lua/approx.lua).
const approxMinute = 60000

// SweepApprox drops the model's expired approximate entries and returns how
// many (replica, block) entries it dropped. Lookup never counts an expired
// entry, so this only bounds memory; SweepExpired calls it too.
func (s *Store) SweepApprox(ctx context.Context, model string) (int, error) {
	total := 0
	now := strconv.FormatInt(ms(s.now()), 10)
	for {
		// Which minute is due is read first, so that the script is told
		// its list as a key rather than building the name itself.
		due, err := s.c.ZRangeByScore(ctx, axqKey(model), &redis.ZRangeBy{Min: "-inf", Max: now, Count: 1}).Result()
		if err != nil {
			return total, wrap("sweep approx", err)
		}
		if len(due) == 0 {
			return total, nil
		}
		minute, err := strconv.ParseInt(due[0], 10, 64)
		if err != nil {
			return total, fmt.Errorf("store: sweep approx: bad minute %q", due[0])
		}
		keys := []string{axKey(model), axqKey(model), axbKey(model, minute)}
		n, err := scriptSweepAx.Run(ctx, s.c, keys, due[0], now, sweepApproxBatch).Int()
		if err != nil {
			return total, wrap("sweep approx", err)
		}
		total += n
	}
}
