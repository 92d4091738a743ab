package tests_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/internal/testfiles"
	"github.com/redis/go-redis/v9"
)

// BenchmarkBookingForms prices, in Redis CPU, the two forms a booking can
// take, to say whether booking without a script would lift one shard's
// ceiling (BenchmarkShardCeiling): reservebest.lua as the store runs it
// (four choices, loads as "p,d,q,v" strings), against what a script-free
// booking would send, MULTI, three HINCRBYs on integer load fields, the
// lease's HSETNX and ZADD, EXEC; and the load read each layout costs a
// decision at 64 replicas (each replica's load and slot fields, as
// lookups read them, against its three integer fields and its slot). The
// server is one of its own with hashes kept as hash tables (the store's
// load hash is one, see '#ht' in store/load.go) and 20,000 leases booked,
// as at the ceiling; each form is sent from 16 goroutines, four a
// pipeline, as the store's batcher coalesces them.
//
//	go test -run '^$' -bench BookingForms -benchtime 1x ./tests/
func BenchmarkBookingForms(b *testing.B) {
	for b.Loop() {
		bookingForms(b)
	}
}

func bookingForms(b *testing.B) {
	ctx := context.Background()
	_, rc := loadRedis(b)
	if err := rc.ConfigSet(ctx, "hash-max-listpack-entries", "0").Err(); err != nil {
		b.Fatal(err)
	}
	src, err := os.ReadFile(filepath.Join(testfiles.Root(), "store", "lua", "reservebest.lua"))
	if err != nil {
		b.Fatal(err)
	}
	script := redis.NewScript(string(src))
	if err := script.Load(ctx, rc).Err(); err != nil {
		b.Fatal(err)
	}
	const reps = 64
	load, loadInt, lb, leases := "kvr:{m:b}:load", "kvr:{m:b}:loadint", "kvr:{m:b}:lb", "kvr:{m:b}:leases"
	var strFields, intFields []string
	for i := range reps {
		r := fmt.Sprintf("r%03d", i)
		rc.HSet(ctx, load, r, "100,200,3,7", r+"#i", i)
		rc.HSet(ctx, loadInt, r+"#p", 100, r+"#d", 200, r+"#q", 3, r+"#i", i)
		strFields = append(strFields, r, r+"#i")
		intFields = append(intFields, r+"#p", r+"#d", r+"#q", r+"#i")
	}
	p := rc.Pipeline()
	for i := range 20000 {
		p.HSet(ctx, lb, "old"+strconv.Itoa(i), "r001,10,4,0")
		p.ZAdd(ctx, leases, redis.Z{Score: float64(1e12 + i), Member: "old" + strconv.Itoa(i)})
	}
	if _, err := p.Exec(ctx); err != nil {
		b.Fatal(err)
	}
	const n, workers = 20000, 16
	measure := func(op func(p redis.Pipeliner, i int)) float64 {
		r0 := readRedisStats(b, rc)
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				for j := 0; j < n/workers; j += 4 {
					p := rc.Pipeline()
					for k := range 4 {
						op(p, w*n/workers+j+k)
					}
					if _, err := p.Exec(ctx); err != nil && err != redis.Nil {
						b.Error(err)
						return
					}
				}
			})
		}
		wg.Wait()
		return us(readRedisStats(b, rc).cpu-r0.cpu) / n
	}
	script1 := measure(func(p redis.Pipeliner, i int) {
		args := []any{"s" + strconv.Itoa(i), "4", "1900000000000", "2", "0", "2048", "4", "1e300", "1e-09", "0"}
		for c := range 4 {
			args = append(args, fmt.Sprintf("r%03d", (i+c)%reps), "1024", "4096")
		}
		script.EvalSha(ctx, p, []string{load, lb, leases}, args...)
	})
	multi := measure(func(p redis.Pipeliner, i int) {
		id, r := "t"+strconv.Itoa(i), fmt.Sprintf("r%03d", i%reps)
		p.Do(ctx, "MULTI")
		p.Do(ctx, "HINCRBY", loadInt, r+"#p", 1024)
		p.Do(ctx, "HINCRBY", loadInt, r+"#d", 4)
		p.Do(ctx, "HINCRBY", loadInt, r+"#q", 1)
		p.Do(ctx, "HSETNX", lb, id, r+",1024,4,0")
		p.Do(ctx, "ZADD", leases, "1900000000000", id)
		p.Do(ctx, "EXEC")
	})
	readStr := measure(func(p redis.Pipeliner, _ int) { p.HMGet(ctx, load, strFields...) })
	readInt := measure(func(p redis.Pipeliner, _ int) { p.HMGet(ctx, loadInt, intFields...) })
	b.Logf("Redis CPU per decision: booking by reservebest.lua %.1f µs, by MULTI/HINCRBY %.1f µs; load read of %d string fields %.1f µs, of %d integer fields %.1f µs; net change of a script-free booking %+.1f µs",
		script1, multi, len(strFields), readStr, len(intFields), readInt, (multi+readInt)-(script1+readStr))
	b.ReportMetric(script1, "script-µs")
	b.ReportMetric(multi, "multi-µs")
	b.ReportMetric(readStr, "read-strings-µs")
	b.ReportMetric(readInt, "read-ints-µs")
	b.ReportMetric((multi+readInt)-(script1+readStr), "net-µs/dec")
}
