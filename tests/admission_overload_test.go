package tests_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/store"
	"github.com/redis/go-redis/v9"
)

// admModel is the one model of the overload fleets.
const admModel = "demo"

// admShape is an overload fleet: replicas sim-replicas that each run at
// most seqs requests at once (--max-num-seqs, and serve's --max-requests
// set to match), decoding decodeTPS tokens a second, three serve pods
// with serveArgs, and an ingestor when ingest is set (so that the index
// learns the replicas' cache from their events).
type admShape struct {
	replicas, seqs int
	maxTokens      int
	decodeTPS      float64
	serveArgs      []string
	ingest         bool
}

// service is one request's time on a replica: its decode (the prefill of
// a few dozen tokens at the default 20000 tokens/s is negligible).
func (s admShape) service() time.Duration {
	return time.Duration(float64(s.maxTokens) / s.decodeTPS * float64(time.Second))
}

// capacity is the requests/s the bounded fleet sustains: every slot busy
// for one service time per request.
func (s admShape) capacity() float64 {
	return float64(s.replicas*s.seqs) / s.service().Seconds()
}

type admFleet struct {
	tb     testing.TB
	shape  admShape
	rc     *redis.Client
	pods   []*loadPod
	client *http.Client
}

func admBinary(tb testing.TB) string {
	if t, ok := tb.(*testing.T); ok && os.Getenv("KVROUTE_BIN") == "" {
		return kvrouteBinary(t)
	}
	return loadBinary(tb)
}

// startAdmFleet starts redis-server, the sim-replicas (registered in the
// store directly), the optional ingestor and three serve pods.
func startAdmFleet(tb testing.TB, s admShape) *admFleet {
	tb.Helper()
	bin := admBinary(tb)
	url, rc := loadRedis(tb)
	st, err := store.Open(context.Background(), url, store.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = st.Close() })
	for i := range s.replicas {
		addr := "127.0.0.1:" + strconv.Itoa(freePort(tb))
		events := "tcp://127.0.0.1:" + strconv.Itoa(freePort(tb))
		replay := "tcp://127.0.0.1:" + strconv.Itoa(freePort(tb))
		startAdmProc(tb, bin, fmt.Sprintf("replica%d", i), "sim-replica", "--model", admModel, "--listen", addr,
			"--events", events, "--replay", replay, "--max-num-seqs", strconv.Itoa(s.seqs),
			"--decode-tokens-per-sec", strconv.FormatFloat(s.decodeTPS, 'f', -1, 64))
		wait.UntilNil(tb, "sim-replica "+addr+" answers /health", func() error { return getOK("http://" + addr + "/health") })
		rep := kvroute.Replica{ID: fmt.Sprintf("r%d", i), Model: admModel, URL: "http://" + addr, Events: events}
		if err := st.PutReplica(context.Background(), rep); err != nil {
			tb.Fatal(err)
		}
	}
	if s.ingest {
		startAdmProc(tb, bin, "ingest", "ingest", "--redis-url", url, "--metrics-listen", "127.0.0.1:0", "--owner", "ingest-a")
	}
	args := append([]string{"--max-requests", strconv.Itoa(s.seqs), "--tenant-header", "X-Tenant", "--queue-ttl", "30s"}, s.serveArgs...)
	f := &admFleet{tb: tb, shape: s, rc: rc, client: &http.Client{Timeout: 60 * time.Second,
		Transport: &http.Transport{MaxIdleConnsPerHost: 512, MaxConnsPerHost: 0}}}
	for i := range 3 {
		f.pods = append(f.pods, startPods(tb, bin, url, 1, append([]string{"--pod-name", fmt.Sprintf("pod%d", i)}, args...)...)...)
	}
	return f
}

// startAdmProc runs one kvroute process, stderr to a log file, stopped
// (SIGTERM, then SIGKILL) when tb ends.
func startAdmProc(tb testing.TB, bin, name string, args ...string) {
	tb.Helper()
	logf, err := os.Create(filepath.Join(tb.TempDir(), name+".log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, append(args, "--log-format", "json")...)
	cmd.Stdout, cmd.Stderr = io.Discard, logf
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		logf.Close()
	})
}

// admReq is one request of a run: which pod, its priority and tenant and
// its prompt.
type admReq struct {
	pod      int
	priority int
	tenant   string
	prompt   []int
	// spread varies max_tokens around the shape's: uniform over
	// [maxTokens/2, maxTokens*3/2] (mean maxTokens), as a real mix of
	// answer lengths; without it every request of a deterministic
	// sim-replica takes the same time and the slots free in lockstep.
	spread bool
}

// admResult is what one request met. latency runs from its scheduled
// send time to its full answer (the proxy is not streamed).
type admResult struct {
	admReq
	seq        int
	sched      time.Time
	status     int
	latency    time.Duration
	retryAfter bool
	queuedMs   int
	cached     int
	err        error
}

// admitAt is when the pod let the request through: its send plus its
// wait (X-Kvroute-Queued-Ms, ms resolution).
func (r admResult) admitAt() time.Time {
	return r.sched.Add(time.Duration(r.queuedMs) * time.Millisecond)
}

// openLoop sends n requests at rate a second, each at its scheduled time
// whatever the answers of the others, and returns every result once all
// have answered.
func (f *admFleet) openLoop(rate float64, n int, mk func(i int) admReq) []admResult {
	out := make([]admResult, n)
	var wg sync.WaitGroup
	t0 := time.Now().Add(20 * time.Millisecond)
	for i := range n {
		at := t0.Add(time.Duration(float64(i) / rate * float64(time.Second)))
		time.Sleep(time.Until(at)) // the open loop's pacing, not a wait on a cause
		wg.Add(1)
		go func() {
			defer wg.Done()
			out[i] = f.send(i, at, mk(i))
		}()
	}
	wg.Wait()
	return out
}

func (f *admFleet) send(seq int, at time.Time, q admReq) admResult {
	r := admResult{admReq: q, seq: seq, sched: at}
	maxTokens := f.shape.maxTokens
	if q.spread {
		maxTokens = maxTokens/2 + int(uint32(seq)*2654435761%uint32(maxTokens+1))
	}
	body, _ := json.Marshal(map[string]any{"model": admModel, "prompt": q.prompt, "max_tokens": maxTokens, "priority": q.priority})
	req, _ := http.NewRequest(http.MethodPost, f.pods[q.pod].base+"/v1/completions", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	if q.tenant != "" {
		req.Header.Set("X-Tenant", q.tenant)
	}
	resp, err := f.client.Do(req)
	if err != nil {
		r.err = err
		return r
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	r.latency = time.Since(at)
	r.status = resp.StatusCode
	r.retryAfter = resp.Header.Get("Retry-After") != ""
	r.queuedMs, _ = strconv.Atoi(resp.Header.Get(api.HeaderQueuedMs))
	var u struct {
		Usage struct {
			Details struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	_ = json.Unmarshal(raw, &u)
	r.cached = u.Usage.Details.Cached
	return r
}

// inFlight samples the fleet's booked requests (the sum of the third
// field of kvr:{m:demo}:load) every few ms until stop is closed, and
// returns the largest seen and the number of samples.
func (f *admFleet) inFlight(stop <-chan struct{}) (peak *atomic.Int64, samples *atomic.Int64) {
	peak, samples = &atomic.Int64{}, &atomic.Int64{}
	go func() {
		tick := time.NewTicker(3 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			m, err := f.rc.HGetAll(context.Background(), "kvr:{m:"+admModel+"}:load").Result()
			if err != nil {
				continue
			}
			var sum int64
			for _, v := range m {
				if parts := strings.Split(v, ","); len(parts) >= 3 {
					n, _ := strconv.ParseInt(parts[2], 10, 64)
					sum += n
				}
			}
			samples.Add(1)
			if sum > peak.Load() {
				peak.Store(sum)
			}
		}
	}()
	return peak, samples
}

// drained waits until the queue is empty and no lease or seat is left.
func (f *admFleet) drained() {
	f.tb.Helper()
	ctx := context.Background()
	wait.UntilNil(f.tb, "queue depth 0 and no lease body left", func() error {
		d, err := f.rc.LLen(ctx, "kvr:{m:"+admModel+"}:depth").Result()
		if err != nil {
			return err
		}
		lb, err := f.rc.HLen(ctx, "kvr:{m:"+admModel+"}:lb").Result()
		if err != nil {
			return err
		}
		if d != 0 || lb != 0 {
			return fmt.Errorf("LLEN depth %d, HLEN lb %d", d, lb)
		}
		return nil
	})
}

// admPrompt is a prompt of n tokens unique to i (no shared prefix).
func admPrompt(i, n int) []int {
	p := make([]int, n)
	for j := range p {
		p[j] = 1000 + (i*7919+j*104729)%50000
	}
	return p
}

// bandStats is the latency and shedding of one set of results.
type bandStats struct {
	n, ok, shed, shedRA, other int
	p50, p99                   time.Duration
	// queued counts the served that waited; qp50 and qp99 are the
	// served's X-Kvroute-Queued-Ms (0 when they did not wait).
	queued     int
	qp50, qp99 time.Duration
}

func statsOf(rs []admResult, keep func(admResult) bool) bandStats {
	var s bandStats
	var lat, q []time.Duration
	for _, r := range rs {
		if !keep(r) {
			continue
		}
		s.n++
		switch r.status {
		case http.StatusOK:
			s.ok++
			lat = append(lat, r.latency)
			q = append(q, time.Duration(r.queuedMs)*time.Millisecond)
			if r.queuedMs > 0 {
				s.queued++
			}
		case http.StatusTooManyRequests:
			s.shed++
			if r.retryAfter {
				s.shedRA++
			}
		default:
			s.other++
		}
	}
	slices.Sort(lat)
	if len(lat) > 0 {
		s.p50 = lat[len(lat)/2]
		s.p99 = lat[min(len(lat)-1, int(0.99*float64(len(lat))))]
	}
	slices.Sort(q)
	if len(q) > 0 {
		s.qp50 = q[len(q)/2]
		s.qp99 = q[min(len(q)-1, int(0.99*float64(len(q))))]
	}
	return s
}

// outcomes counts results by outcome; anything but 200, 429 and 503
// (including a transport error) is counted under 0.
func outcomes(rs []admResult) map[int]int {
	m := map[int]int{}
	for _, r := range rs {
		switch r.status {
		case http.StatusOK, http.StatusTooManyRequests, http.StatusServiceUnavailable:
			m[r.status]++
		default:
			m[0]++
		}
	}
	return m
}

// priorityMix is request i of a priority run: 20% high (priority -1),
// round robin over the pods.
func priorityMix(i int) admReq {
	p := 0
	if i%5 == 0 {
		p = -1
	}
	return admReq{pod: i % 3, priority: p, prompt: admPrompt(i, 32), spread: true}
}

func high(r admResult) bool { return r.priority < 0 }
func low(r admResult) bool  { return r.priority >= 0 }

// outOfOrder is the share of admissions out of FCFS order among rs (one
// tenant, one band): a request admitted more than slack before one sent
// more than slack before it. Admission time is send time plus the wait
// the pod reports; slack covers the loopback jitter between a send and
// its push into the shared queue and the header's ms rounding.
func outOfOrder(rs []admResult, slack time.Duration) (bad, total int) {
	var ok []admResult
	for _, r := range rs {
		if r.status == http.StatusOK {
			ok = append(ok, r)
		}
	}
	slices.SortFunc(ok, func(a, b admResult) int { return a.seq - b.seq })
	var latest time.Time // latest admission among those sent more than slack earlier
	j := 0
	for i, r := range ok {
		for j < i && ok[j].sched.Before(r.sched.Add(-slack)) {
			if a := ok[j].admitAt(); a.After(latest) {
				latest = a
			}
			j++
		}
		if r.admitAt().Before(latest.Add(-slack)) {
			bad++
		}
	}
	return bad, len(ok)
}

// overloadShape is the fleet of the priority and pods runs: 3 replicas
// of 2 slots, 0.1 s a request: 60 requests/s.
func overloadShape() admShape {
	return admShape{replicas: 3, seqs: 2, maxTokens: 10, decodeTPS: 100,
		serveArgs: []string{"--max-in-flight", "6", "--band-limit", "40"}}
}

// TestAdmissionOverloadShort: three serve pods over real sim-replicas at
// twice the fleet's capacity, 20% high priority: no high request is shed,
// the fleet's booked requests never pass the limit, every request gets
// exactly one of 200, 429 and 503 (a 429 with Retry-After), and after the
// drain the queue and the lease bodies are empty.
func TestAdmissionOverloadShort(t *testing.T) {
	s := overloadShape()
	f := startAdmFleet(t, s)
	stop := make(chan struct{})
	peak, samples := f.inFlight(stop)
	rate := 2 * s.capacity()
	rs := f.openLoop(rate, int(3*rate), priorityMix)
	close(stop)
	hi, lo := statsOf(rs, high), statsOf(rs, low)
	t.Logf("high %+v low %+v peak in-flight %d over %d samples", hi, lo, peak.Load(), samples.Load())
	if hi.ok != hi.n {
		t.Errorf("high band: %d of %d served, want all (%+v)", hi.ok, hi.n, hi)
	}
	if lo.shed == 0 {
		t.Errorf("low band: no 429 at twice the capacity, want some")
	}
	if lo.shedRA != lo.shed {
		t.Errorf("low band: %d of %d 429s with Retry-After, want all", lo.shedRA, lo.shed)
	}
	if got := outcomes(rs); got[0] != 0 {
		t.Errorf("outcomes %v: want only 200, 429 and 503", got)
	}
	if got, want := peak.Load(), int64(s.replicas*s.seqs); got > want || samples.Load() == 0 {
		t.Errorf("fleet in-flight peak %d over %d samples, want <= %d", got, samples.Load(), want)
	}
	f.drained()
	// Exactly one outcome each, as the pods count them: every 200 admitted
	// once, every 429 shed once.
	got := outcomes(rs)
	if adm, shed := f.counter("kvroute_admitted_total"), f.counter("kvroute_shed_total"); adm != float64(got[200]) || shed != float64(got[429]) {
		t.Errorf("pods count %v admitted and %v shed, want %d and %d (the clients' 200s and 429s)", adm, shed, got[200], got[429])
	}
}

// counter is the sum over the pods of every series of the counter name
// on their /metrics.
func (f *admFleet) counter(name string) float64 {
	f.tb.Helper()
	var sum float64
	for _, p := range f.pods {
		resp, err := f.client.Get(p.base + "/metrics")
		if err != nil {
			f.tb.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(raw), "\n") {
			if rest, ok := strings.CutPrefix(line, name); ok && (strings.HasPrefix(rest, "{") || strings.HasPrefix(rest, " ")) {
				v, _ := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
				sum += v
			}
		}
	}
	return sum
}

// admSecs is the length of a benchmark phase: KVROUTE_ADM_SECS (default 10).
func admSecs() float64 { return float64(envInt("KVROUTE_ADM_SECS", 10)) }

// BenchmarkAdmissionPriority: the fleet at 50% of its capacity, then at
// twice it with 20% of requests high priority, spread over three pods.
// Latency is the time to the full (non-streamed) answer from the
// scheduled send. Two fleet shapes: 6 slots of 0.1 s and 24 slots of
// 0.4 s (the same 60 requests/s): a high request never preempts a
// running one, so at 2x it waits for the next slot to free, a wait that
// shrinks against the service time as the slots grow.
//
//	KVROUTE_ADM_SECS=60 go test -run '^$' -bench AdmissionPriority -benchtime 1x -timeout 20m ./tests/
func BenchmarkAdmissionPriority(b *testing.B) {
	wide := admShape{replicas: 3, seqs: 8, maxTokens: 20, decodeTPS: 50,
		serveArgs: []string{"--max-in-flight", "24", "--band-limit", "40"}}
	for _, s := range []admShape{overloadShape(), wide} {
		b.Run(fmt.Sprintf("slots=%d/service=%v", s.replicas*s.seqs, s.service()), func(b *testing.B) {
			for b.Loop() {
				runPriority(b, s)
			}
		})
	}
}

// runPriority is one BenchmarkAdmissionPriority run on a fleet of shape s.
func runPriority(b *testing.B, s admShape) {
	f := startAdmFleet(b, s)
	secs, c := admSecs(), s.capacity()
	// Capacity, measured: a short saturating run (3x, 3 s).
	sat := f.openLoop(3*c, int(9*c), priorityMix)
	var served int
	first, last := time.Time{}, time.Time{}
	for _, r := range sat {
		if r.status == http.StatusOK {
			served++
			end := r.sched.Add(r.latency)
			if first.IsZero() || r.sched.Before(first) {
				first = r.sched
			}
			if end.After(last) {
				last = end
			}
		}
	}
	measured := float64(served) / last.Sub(first).Seconds()
	f.drained()
	half := f.openLoop(0.5*c, int(0.5*c*secs), priorityMix)
	f.drained()
	stop := make(chan struct{})
	peak, samples := f.inFlight(stop)
	over := f.openLoop(2*c, int(2*c*secs), priorityMix)
	close(stop)
	f.drained()
	h50, h2, l2 := statsOf(half, high), statsOf(over, high), statsOf(over, low)
	b.Logf("capacity: derived %.1f req/s, measured %.1f req/s (served %d of %d at 3x)", c, measured, served, len(sat))
	b.Logf("50%%: high %+v low %+v", h50, statsOf(half, low))
	b.Logf("2x: high %+v low %+v outcomes %v", h2, l2, outcomes(over))
	b.Logf("2x: high served that queued %d of %d, their queued-ms p50 %v p99 %v", h2.queued, h2.ok, h2.qp50, h2.qp99)
	b.Logf("2x: fleet in-flight peak %d (limit %d) over %d samples", peak.Load(), s.replicas*s.seqs, samples.Load())
	ratio := h2.p99.Seconds() / h50.p99.Seconds()
	b.Logf("high p50 %v -> %v, p99 %v -> %v, p99 ratio 2x/50%% %.3f", h50.p50, h2.p50, h50.p99, h2.p99, ratio)
	b.ReportMetric(ratio, "high-p99-ratio")
	b.ReportMetric(float64(h2.n-h2.ok), "high-not-served")
	b.ReportMetric(float64(l2.shed), "low-429")
	b.ReportMetric(float64(l2.shedRA), "low-429-retry-after")
}

// BenchmarkAdmissionPods: twice the capacity, one tenant, one band, sent
// 70/20/10% to the three pods: the share of admissions out of FCFS order
// and the fleet's peak in-flight.
//
//	KVROUTE_ADM_SECS=60 go test -run '^$' -bench AdmissionPods -benchtime 1x -timeout 20m ./tests/
func BenchmarkAdmissionPods(b *testing.B) {
	for b.Loop() {
		s := overloadShape()
		f := startAdmFleet(b, s)
		c := s.capacity()
		stop := make(chan struct{})
		peak, samples := f.inFlight(stop)
		rs := f.openLoop(2*c, int(2*c*admSecs()), func(i int) admReq {
			pod := 0
			switch m := i % 10; {
			case m >= 9:
				pod = 2
			case m >= 7:
				pod = 1
			}
			return admReq{pod: pod, tenant: "t", prompt: admPrompt(i, 32)}
		})
		close(stop)
		f.drained()
		bad, total := outOfOrder(rs, 5*time.Millisecond)
		perPod := [3][2]int{}
		for _, r := range rs {
			perPod[r.pod][0]++
			if r.status == http.StatusOK {
				perPod[r.pod][1]++
			}
		}
		b.Logf("sent/served per pod %v, outcomes %v", perPod, outcomes(rs))
		b.Logf("out of order: %d of %d served (%.3f%%)", bad, total, 100*float64(bad)/float64(max(total, 1)))
		b.Logf("fleet in-flight peak %d (limit %d) over %d samples", peak.Load(), s.replicas*s.seqs, samples.Load())
		b.ReportMetric(100*float64(bad)/float64(max(total, 1)), "%out-of-order")
		b.ReportMetric(float64(peak.Load()), "peak-in-flight")
	}
}

// jain is Jain's fairness index over xs.
func jain(xs ...float64) float64 {
	var s, s2 float64
	for _, x := range xs {
		s += x
		s2 += x * x
	}
	if s2 == 0 {
		return math.NaN()
	}
	return s * s / (float64(len(xs)) * s2)
}

// BenchmarkAdmissionFairness: tenants A and B in one band, A offering 10x
// B's rate, B alone offering 0.8x the fleet's capacity (more than its fair
// half, so both stay backlogged); served cost per tenant = uncached prompt
// tokens (from the replica's usage) + max_tokens of requests served. Then
// tenants C (every prompt repeats one 256-token prefix: cache hits, with
// an ingestor feeding the index the replicas' events) and D (unique
// prompts of the same length) at equal rates: requests served per tenant.
// KVROUTE_ADM_FAIR_SERVE replaces the serve flags (default --tenant-limit 30).
//
//	KVROUTE_ADM_SECS=60 go test -run '^$' -bench AdmissionFairness -benchtime 1x -timeout 20m ./tests/
func BenchmarkAdmissionFairness(b *testing.B) {
	for b.Loop() {
		s := admShape{replicas: 3, seqs: 2, maxTokens: 10, decodeTPS: 50, ingest: true,
			serveArgs: []string{"--tenant-limit", "30"}}
		if v := os.Getenv("KVROUTE_ADM_FAIR_SERVE"); v != "" {
			s.serveArgs = strings.Fields(v) // e.g. "--tenant-limit 0 --band-limit 100"
		}
		f := startAdmFleet(b, s)
		c, secs := s.capacity(), admSecs()
		cost := func(rs []admResult) map[string]float64 {
			m := map[string]float64{}
			for _, r := range rs {
				if r.status == http.StatusOK {
					m[r.tenant] += float64(len(r.prompt) - r.cached + s.maxTokens)
				}
			}
			return m
		}
		count := func(rs []admResult) map[string]int {
			m := map[string]int{}
			for _, r := range rs {
				if r.status == http.StatusOK {
					m[r.tenant]++
				}
			}
			return m
		}
		// A: 10 of every 11 requests; B: 1 of 11. Offered 8.8x capacity.
		rs := f.openLoop(8.8*c, int(8.8*c*secs), func(i int) admReq {
			t := "A"
			if i%11 == 0 {
				t = "B"
			}
			return admReq{pod: i % 3, tenant: t, prompt: admPrompt(i, 64)}
		})
		f.drained()
		cs := cost(rs)
		b.Logf("A/B: served cost %v, served %v, outcomes %v, Jain %.4f", cs, count(rs), outcomes(rs), jain(cs["A"], cs["B"]))
		b.ReportMetric(jain(cs["A"], cs["B"]), "jain")

		prefix := admPrompt(1<<20, 256)
		rs = f.openLoop(2*c, int(2*c*secs), func(i int) admReq {
			if i%2 == 0 {
				return admReq{pod: i % 3, tenant: "C", prompt: append(slices.Clone(prefix), admPrompt(i, 16)...)}
			}
			return admReq{pod: i % 3, tenant: "D", prompt: admPrompt(i, 272)}
		})
		f.drained()
		cs, n := cost(rs), count(rs)
		var cachedC int
		for _, r := range rs {
			if r.tenant == "C" && r.status == http.StatusOK {
				cachedC += r.cached
			}
		}
		b.Logf("C/D: served %v, served cost %v, C's cached tokens %d, outcomes %v", n, cs, cachedC, outcomes(rs))
		b.ReportMetric(float64(n["C"])/float64(max(n["D"], 1)), "C/D-served")
	}
}
