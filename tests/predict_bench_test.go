package tests_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/store"
)

// predictBench is one side of BenchmarkPredictionCost: a pod and the model
// it decides for.
type predictBench struct {
	model  string
	pod    *loadPod
	bodies [][]byte
	client *http.Client
}

// predictBenchModel registers 4 replicas of model, each with an events
// endpoint (a booking predicts only on a replica that publishes events;
// nothing needs to listen there, no ingestor runs), the first holding ctx's
// full blocks, and returns n decision bodies: ctx plus a varied 32-token
// suffix each.
func predictBenchModel(tb testing.TB, st *store.Store, model string, ctx []uint32, n int) [][]byte {
	tb.Helper()
	bg := context.Background()
	for i := range 4 {
		rep := kvroute.Replica{ID: fmt.Sprintf("%s-r%d", model, i), Model: model, URL: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:1"}
		if err := st.PutReplica(bg, rep); err != nil {
			tb.Fatal(err)
		}
	}
	keys := kvroute.BlockKeys(kvroute.KeySpace{Model: model}, kvroute.DefaultBlockSize, ctx, nil)
	holdChain(tb, bg, st, model, model+"-r0", keys, 1, func(j int) uint64 { return uint64(keys[j]) ^ uint64(j) })
	var bodies [][]byte
	for i := range n {
		p := append(slices.Clone(ctx), seqTokens(100000+i*32, 32)...)
		raw, _ := json.Marshal(map[string]any{"model": model, "token_ids": p, "max_tokens": 64})
		bodies = append(bodies, raw)
	}
	return bodies
}

// decide makes one decision, timed, and releases it (untimed); the error
// says which of the two did not answer 200.
func (p *predictBench) decide(i int) (time.Duration, error) {
	t0 := time.Now()
	resp, err := p.client.Post(p.pod.base+"/v1/route", "application/json", bytes.NewReader(p.bodies[i%len(p.bodies)]))
	if err != nil {
		return 0, err
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	took := time.Since(t0)
	var d struct {
		RequestID string `json:"request_id"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &d) != nil {
		return took, fmt.Errorf("route: got %d %.300s, want 200", resp.StatusCode, raw)
	}
	rel, err := p.client.Post(p.pod.base+"/v1/requests/"+d.RequestID+"/release", "application/json", nil)
	if err != nil {
		return took, err
	}
	raw, _ = io.ReadAll(rel.Body)
	rel.Body.Close()
	if rel.StatusCode != http.StatusOK {
		return took, fmt.Errorf("release: got %d %.300s, want 200", rel.StatusCode, raw)
	}
	return took, nil
}

// predictPhase is what one phase of sequential decisions measured.
type predictPhase struct {
	ok, errs          int
	firstErr          error
	lat               []time.Duration
	procCPU, mainCPU  time.Duration
	scriptUs, scripts int64
}

func (a *predictPhase) add(b *predictPhase) {
	a.ok += b.ok
	a.errs += b.errs
	a.lat = append(a.lat, b.lat...)
	a.procCPU += b.procCPU
	a.mainCPU += b.mainCPU
	a.scriptUs += b.scriptUs
	a.scripts += b.scripts
}

func (a *predictPhase) p50() time.Duration {
	s := slices.Clone(a.lat)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// per is d per decision, in µs.
func (a *predictPhase) per(d time.Duration) float64 { return us(d) / float64(max(a.ok, 1)) }

// run makes n sequential decisions (one client: unsaturated) between two
// readings of Redis's CPU and commandstats.
func (p *predictBench) run(tb testing.TB, rc *redis.Client, from, n int) *predictPhase {
	ph := &predictPhase{}
	cpu0, s0 := redisProcCPU(tb, rc), readRedisStats(tb, rc)
	for i := range n {
		took, err := p.decide(from + i)
		if err != nil {
			if ph.errs == 0 {
				ph.firstErr = err
			}
			ph.errs++
			continue
		}
		ph.ok++
		ph.lat = append(ph.lat, took)
	}
	cpu1, s1 := redisProcCPU(tb, rc), readRedisStats(tb, rc)
	ph.procCPU, ph.mainCPU = cpu1-cpu0, s1.cpu-s0.cpu
	for _, c := range []string{"evalsha", "evalsha_ro", "eval", "eval_ro"} {
		ph.scriptUs += s1.usec[c] - s0.usec[c]
		ph.scripts += s1.calls[c] - s0.calls[c]
	}
	return ph
}

// BenchmarkPredictionCost is what predicted entries cost an unsaturated
// decision in Redis (issue 22: at most 1.1× its Redis time without them).
// Two `kvroute serve` pods over one redis-server, one with predictions on
// (the default) and one with --predict-weight=0, each deciding for a model
// of its own (4 replicas with events, the first holding a 2,000-token
// context); decisions are POST /v1/route on that context plus a varied
// 32-token suffix (every booking writes a prediction), made one at a time
// by one client in 6 alternating phases, each released right after its
// answer (so its prediction, released before a first token, is deleted
// by the release: that is part of what is measured). Figures per decision
// (decision and release): Redis CPU (INFO cpu, the process and the main
// thread), script time (commandstats' eval*), and the decision's p50,
// each on and off, and their ratios. The idle pod's background work falls
// in every phase.
//
//	go test -run '^$' -bench PredictionCost -benchtime 1x ./tests/
func BenchmarkPredictionCost(b *testing.B) {
	bin := loadBinary(b)
	for b.Loop() {
		url, rc := loadRedis(b)
		st, err := store.Open(context.Background(), url, store.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		ctx := seqTokens(10000, 2000)
		n := envInt("KVROUTE_PREDICT_DECISIONS", 1000)
		client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 30 * time.Second}
		side := map[bool]*predictBench{}
		for _, on := range []bool{true, false} {
			var args []string
			model := "pc-on"
			if !on {
				args, model = []string{"--predict-weight=0"}, "pc-off"
			}
			side[on] = &predictBench{model: model, pod: startPods(b, bin, url, 1, args...)[0],
				bodies: predictBenchModel(b, st, model, ctx, 256), client: client}
			side[on].run(b, rc, 0, 200) // warm-up: connections, script SHAs, registry cache
		}
		agg := map[bool]*predictPhase{true: {}, false: {}}
		for round := range 6 {
			on := round%2 == 0
			ph := side[on].run(b, rc, round*n, n)
			if ph.errs > 0 {
				b.Errorf("predictions on=%v: %d of %d decisions failed, the first: %v", on, ph.errs, n, ph.firstErr)
			}
			agg[on].add(ph)
		}
		on, off := agg[true], agg[false]
		for _, s := range []struct {
			name string
			p    *predictPhase
		}{{"on ", on}, {"off", off}} {
			b.Logf("predictions %s: %d decisions, p50 %.0f µs; Redis per decision+release: process %.1f µs, main thread %.1f µs CPU, scripts %.1f µs in %.2f calls",
				s.name, s.p.ok, us(s.p.p50()), s.p.per(s.p.procCPU), s.p.per(s.p.mainCPU), float64(s.p.scriptUs)/float64(max(s.p.ok, 1)), float64(s.p.scripts)/float64(max(s.p.ok, 1)))
		}
		b.ReportMetric(on.per(on.procCPU)/off.per(off.procCPU), "redis-cpu-on/off")
		b.ReportMetric(on.per(on.mainCPU)/off.per(off.mainCPU), "redis-main-cpu-on/off")
		b.ReportMetric(float64(on.scriptUs)/float64(max(on.ok, 1))/(float64(off.scriptUs)/float64(max(off.ok, 1))), "script-us-on/off")
		b.ReportMetric(float64(on.p50())/float64(off.p50()), "p50-on/off")
	}
}
