package tests_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/store"
)

// predictBench is one side of BenchmarkPredictionCost: a pod and the model
// it decides for.
type predictBench struct {
	model  string
	pod    *loadPod
	bodies [][]byte
	client *http.Client
	// firstToken reports each decision's first token before its release.
	firstToken bool
	// events, when set, also applies each decision's prompt as its
	// replica's cache events after the first token, as an ingestor
	// would: what confirms a prediction on a fleet that runs one.
	events func(tb testing.TB, replica string, i int)
	tb     testing.TB
}

// predictBenchModel registers 4 replicas of model, each with an events
// endpoint (a booking predicts only on a replica that publishes events;
// nothing needs to listen there, no ingestor runs), the first holding ctx's
// full blocks, and returns n decision bodies: ctx plus a varied 32-token
// suffix each.
func predictBenchModel(tb testing.TB, st *store.Store, model string, ctx []uint32, n int, cold bool) [][]byte {
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
		if cold {
			// A prompt of its own, nothing of it held anywhere.
			p = seqTokens(1_000_000+i*len(p), len(p))
		}
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
		Replica   struct {
			ID string `json:"id"`
		} `json:"replica"`
	}
	if resp.StatusCode != http.StatusOK || json.Unmarshal(raw, &d) != nil {
		return took, fmt.Errorf("route: got %d %.300s, want 200", resp.StatusCode, raw)
	}
	var steps []string
	if p.firstToken {
		steps = append(steps, "first-token")
	}
	for _, step := range append(steps, "release") {
		if step == "release" && p.events != nil {
			p.events(p.tb, d.Replica.ID, i)
		}
		resp, err := p.client.Post(p.pod.base+"/v1/requests/"+d.RequestID+"/"+step, "application/json", nil)
		if err != nil {
			return took, err
		}
		raw, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return took, fmt.Errorf("%s: got %d %.300s, want 200", step, resp.StatusCode, raw)
		}
	}
	return took, nil
}

// benchEvents applies decision i's prompt as replica's cache events (as
// an ingestor would, one batch of the whole chain; a block already held
// only gains a reference).
func benchEvents(st *store.Store, model string, bodies [][]byte) func(tb testing.TB, replica string, i int) {
	seq := map[string]int64{}
	return func(tb testing.TB, replica string, i int) {
		var body struct {
			TokenIDs []uint32 `json:"token_ids"`
		}
		if err := json.Unmarshal(bodies[i%len(bodies)], &body); err != nil {
			tb.Fatal(err)
		}
		keys := kvroute.BlockKeys(kvroute.KeySpace{Model: model}, kvroute.DefaultBlockSize, body.TokenIDs, nil)
		seq[replica] = holdChain(tb, context.Background(), st, model, replica, keys, seq[replica]+1, func(j int) uint64 { return uint64(keys[j]) ^ uint64(j) }) - 1
	}
}

// predictPhase is what one phase of sequential decisions measured.
type predictPhase struct {
	ok, errs          int
	firstErr          error
	s0                redisStats
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

// begin and end read Redis's CPU and commandstats around a phase; one
// makes decision i in it.
func (ph *predictPhase) begin(tb testing.TB, rc *redis.Client) {
	ph.procCPU, ph.mainCPU = -redisProcCPU(tb, rc), -readRedisStats(tb, rc).cpu
	ph.scriptUs, ph.scripts = 0, 0
	ph.s0 = readRedisStats(tb, rc)
}

func (ph *predictPhase) one(p *predictBench, i int) {
	took, err := p.decide(i)
	if err != nil {
		if ph.errs == 0 {
			ph.firstErr = err
		}
		ph.errs++
		return
	}
	ph.ok++
	ph.lat = append(ph.lat, took)
}

func (ph *predictPhase) end(tb testing.TB, rc *redis.Client) {
	ph.procCPU += redisProcCPU(tb, rc)
	s1 := readRedisStats(tb, rc)
	ph.mainCPU += s1.cpu
	for _, c := range []string{"evalsha", "evalsha_ro", "eval", "eval_ro"} {
		ph.scriptUs += s1.usec[c] - ph.s0.usec[c]
		ph.scripts += s1.calls[c] - ph.s0.calls[c]
	}
}

// run makes n sequential decisions (one client: unsaturated) in one phase.
func (p *predictBench) run(tb testing.TB, rc *redis.Client, from, n int) *predictPhase {
	ph := &predictPhase{}
	ph.begin(tb, rc)
	for i := range n {
		ph.one(p, from+i)
	}
	ph.end(tb, rc)
	return ph
}

// BenchmarkPredictionCost is what predicted entries cost an unsaturated
// decision in Redis (issue 22: at most 1.1× its Redis time without them).
// Two sides, each one `kvroute serve` pod over a redis-server of its own,
// one with predictions on (the default) and one with --predict-weight=0,
// deciding for a model of 4 replicas with events, the first holding a
// 2,000-token context; decisions are POST /v1/route (prompt=cached) on that
// context plus a varied 32-token suffix (which predicts nothing: the
// replica holds all but 2 blocks of it, kvroute.MinPredictBlocks), or
// (prompt=cold) on 2,032-token prompts nothing holds, 256 of them in turn
// (every booking writes a prediction), made one at
// a time by one client, alternating between the sides decision by
// decision, so that the machine's drift (2 cores shared by both servers,
// both pods and the client) falls on both alike; each Redis's CPU is its
// side's alone. Each decision is ended right after its answer:
//
//   - release=before-first-token: released at once, so its prediction is
//     deleted by the release (part of what is measured);
//   - release=after-first-token: first-token, then released, so its
//     prediction lives on to its expiry (no ingestor confirms it) and the
//     replicas carry up to kvroute.MaxPredictions each, which every
//     lookup reads: the steady state of a busy fleet.
//
// Figures per decision (its release included): Redis CPU (INFO cpu, the
// process and the main thread), script time (commandstats' eval*), the
// decision's p50, on and off, their ratios over the run, and the ratio of
// each tenth of the run (logged, with their median) for its spread.
//
//	go test -run '^$' -bench PredictionCost -benchtime 1x ./tests/
func BenchmarkPredictionCost(b *testing.B) {
	bin := loadBinary(b)
	for _, cold := range []bool{false, true} {
		for _, release := range []string{"before-first-token", "after-first-token", "after-events"} {
			name := "prompt=cached/release=" + release
			if cold {
				name = "prompt=cold/release=" + release
			}
			b.Run(name, func(b *testing.B) {
				for b.Loop() {
					predictCost(b, bin, release, cold)
				}
			})
		}
	}
}

// predictSide is one side of predictCost: its pod and its Redis.
type predictSide struct {
	*predictBench
	rc *redis.Client
}

func predictCost(b *testing.B, bin, release string, cold bool) {
	firstToken := release != "before-first-token"
	ctx := seqTokens(10000, 2000)
	n := envInt("KVROUTE_PREDICT_DECISIONS", 3000)
	const slices10 = 10
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 30 * time.Second}
	side := map[bool]*predictSide{}
	for _, on := range []bool{true, false} {
		url, rc := loadRedis(b)
		st, err := store.Open(context.Background(), url, store.Options{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { st.Close() })
		var args []string
		if !on {
			args = []string{"--predict-weight=0"}
		}
		bodies := predictBenchModel(b, st, "pc", ctx, 256, cold)
		p := &predictBench{model: "pc", pod: startPods(b, bin, url, 1, args...)[0], bodies: bodies, client: client, firstToken: firstToken, tb: b}
		if release == "after-events" {
			p.events = benchEvents(st, "pc", bodies)
		}
		wait.UntilNil(b, "a first decision on the predictions-on="+strconv.FormatBool(on)+" side", func() error {
			_, err := p.decide(0)
			return err
		})
		p.run(b, rc, 0, 200) // warm-up: connections, script SHAs, registry cache
		side[on] = &predictSide{rc: rc, predictBench: p}
	}
	agg := map[bool]*predictPhase{true: {}, false: {}}
	var tenths []float64
	for k := range slices10 {
		ph := map[bool]*predictPhase{true: {}, false: {}}
		for on, s := range side {
			ph[on].begin(b, s.rc)
		}
		for i := range n / slices10 {
			for _, on := range []bool{true, false} {
				ph[on].one(side[on].predictBench, k*n/slices10+i)
			}
		}
		for on, s := range side {
			ph[on].end(b, s.rc)
			if ph[on].errs > 0 {
				b.Errorf("predictions on=%v: %d of %d decisions failed, the first: %v", on, ph[on].errs, n/slices10, ph[on].firstErr)
			}
			agg[on].add(ph[on])
		}
		tenths = append(tenths, ph[true].per(ph[true].procCPU)/ph[false].per(ph[false].procCPU))
	}
	on, off := agg[true], agg[false]
	for _, s := range []struct {
		name string
		p    *predictPhase
	}{{"on ", on}, {"off", off}} {
		b.Logf("predictions %s: %d decisions, p50 %.0f µs; Redis per decision+release: process %.1f µs, main thread %.1f µs CPU, scripts %.1f µs in %.2f calls",
			s.name, s.p.ok, us(s.p.p50()), s.p.per(s.p.procCPU), s.p.per(s.p.mainCPU), float64(s.p.scriptUs)/float64(max(s.p.ok, 1)), float64(s.p.scripts)/float64(max(s.p.ok, 1)))
	}
	// Predicted entries live in the load hash, field <replica>#p
	// (store/lua/predict.lua).
	var sizes []string
	for i := range 4 {
		f := fmt.Sprintf("pc-r%d#p", i)
		n, _ := side[true].rc.HStrLen(context.Background(), "kvr:{m:pc}:load", f).Result()
		sizes = append(sizes, fmt.Sprintf("%s %d B", f, n))
	}
	b.Logf("predicted entries left at the end (predictions-on side): %s", strings.Join(sizes, ", "))
	if os.Getenv("KVROUTE_PREDICT_STATS") != "" {
		for _, on := range []bool{true, false} {
			st, _ := side[on].rc.Info(context.Background(), "commandstats").Result()
			var keep []string
			for _, l := range strings.Split(st, "\r\n") {
				if strings.HasPrefix(l, "cmdstat_eval") || strings.HasPrefix(l, "cmdstat_hmget") || strings.HasPrefix(l, "cmdstat_h") {
					keep = append(keep, strings.Split(l, ",rejected")[0])
				}
			}
			b.Logf("on=%v commandstats: %s", on, strings.Join(keep, " | "))
		}
	}
	sorted := slices.Clone(tenths)
	slices.Sort(sorted)
	b.Logf("Redis process CPU on/off of each tenth of the run: %.3f (median %.3f)", tenths, sorted[len(sorted)/2])
	b.ReportMetric(on.per(on.procCPU)/off.per(off.procCPU), "redis-cpu-on/off")
	b.ReportMetric(on.per(on.mainCPU)/off.per(off.mainCPU), "redis-main-cpu-on/off")
	b.ReportMetric(float64(on.scriptUs)/float64(max(on.ok, 1))/(float64(off.scriptUs)/float64(max(off.ok, 1))), "script-us-on/off")
	b.ReportMetric(float64(on.p50())/float64(off.p50()), "p50-on/off")
}
