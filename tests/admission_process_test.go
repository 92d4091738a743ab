package tests_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute/internal/wait"
)

// admSims starts n `kvroute sim-replica` processes for model (each on
// loopback ports picked here, with extra flags), waits until each answers
// /health, registers each with the pod at base (PUT /v1/replicas/{id})
// and returns their ids.
func admSims(t *testing.T, bin, base, model string, n int, extra ...string) []string {
	t.Helper()
	var ids []string
	for i := range n {
		addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
		args := append([]string{"sim-replica", "--model", model, "--listen", addr,
			"--events", "tcp://127.0.0.1:" + strconv.Itoa(freePort(t)),
			"--replay", "tcp://127.0.0.1:" + strconv.Itoa(freePort(t))}, extra...)
		cmd := exec.Command(bin, args...)
		cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		wait.UntilNil(t, "sim-replica "+addr+" answers /health", func() error { return getOK("http://" + addr + "/health") })
		id := fmt.Sprintf("%s-s%d", model, i)
		admRegister(t, base, id, model, "http://"+addr)
		ids = append(ids, id)
	}
	return ids
}

// admRegister puts one replica through the pod's admin API.
func admRegister(t *testing.T, base, id, model, url string) {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"url":%q}`, model, url)
	req, _ := http.NewRequest(http.MethodPut, base+"/v1/replicas/"+id, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		t.Fatalf("PUT /v1/replicas/%s: got %d %s, want 2xx", id, resp.StatusCode, raw)
	}
}

// admComplete sends one /v1/completions to base for model and returns
// the status (0 and the error when the client or the connection ended).
func admComplete(ctx context.Context, c *http.Client, base, model string, maxTokens int, hdr map[string]string) (int, error) {
	body := fmt.Sprintf(`{"model":%q,"prompt":"hello there","max_tokens":%d}`, model, maxTokens)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	_, err = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if err != nil {
		return 0, err
	}
	return resp.StatusCode, nil
}

// admState is the model's admission state in Redis: queue depth, lease
// bodies, and the booked requests summed over the load hash.
type admState struct {
	depth, leases, booked int64
}

func readAdmState(t *testing.T, rc redis.Cmdable, model string) admState {
	t.Helper()
	ctx := context.Background()
	pre := "kvr:{m:" + model + "}:"
	var s admState
	s.depth, _ = rc.LLen(ctx, pre+"depth").Result()
	s.leases, _ = rc.HLen(ctx, pre+"lb").Result()
	load, _ := rc.HGetAll(ctx, pre+"load").Result()
	for field, v := range load {
		if strings.Contains(field, "#") {
			// Not a booked load: the scraped load (#s), a slot (#i),
			// predictions (#p), counters.
			continue
		}
		f := strings.Split(v, ",")
		if len(f) >= 3 {
			n, _ := strconv.ParseInt(f[2], 10, 64)
			s.booked += n
		}
	}
	return s
}

// admRoute asks base for one decision that may not wait and returns the
// status.
func admRoute(t *testing.T, base, model string) int {
	t.Helper()
	body := fmt.Sprintf(`{"model":%q,"token_ids":[1,2,3,4,5,6,7,8],"max_tokens":8,"max_wait_ms":0}`, model)
	resp, err := http.Post(base+"/v1/route", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestAdmissionPodKilled: two `kvroute serve` pods over a real
// redis-server share one queue for a fleet of two sim-replicas of one
// request each, kept full by two long requests through pod 2. 100
// requests queue on pod 1, which is then SIGKILLed; one long request is
// released. Within hold (5 s) + grant (2 s) + an idle beat (1 s) no
// capacity stays taken by the dead pod: depth 0, booked requests and
// lease bodies equal pod 2's one real request, and a new request on pod 2
// is admitted. Pod 2 holds no waiter: its beat kicks the model because it
// served it lately. No ingestor sweeps (KVROUTE_ADM_INGEST=1 adds one,
// and its sweep interval to the bound).
func TestAdmissionPodKilled(t *testing.T) {
	const model = "demo"
	bin := kvrouteBinary(t)
	url, rc := loadRedis(t)
	lim := []string{"--max-requests", "1", "--queue-ttl", "60s"}
	p1 := startPods(t, bin, url, 1, append(lim, "--pod-name", "p1")...)[0]
	p2 := startPods(t, bin, url, 1, append(lim, "--pod-name", "p2")...)[0]
	bound := 5*time.Second + 2*time.Second + time.Second + 500*time.Millisecond
	if os.Getenv("KVROUTE_ADM_INGEST") != "" {
		startIngest(t, bin, url)
		bound += 5 * time.Second
	}
	admSims(t, bin, p2.base, model, 2, "--decode-tokens-per-sec", "1")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}

	var long []context.CancelFunc
	var wg sync.WaitGroup
	for range 2 {
		ctx, cancel := context.WithCancel(context.Background())
		long = append(long, cancel)
		wg.Go(func() { _, _ = admComplete(ctx, client, p2.base, model, 100000, nil) })
	}
	t.Cleanup(func() {
		for _, c := range long {
			c()
		}
		wg.Wait()
	})
	wait.Until(t, "the two long requests booked", func() bool { return readAdmState(t, rc, model).booked == 2 })

	qctx, qcancel := context.WithCancel(context.Background())
	defer qcancel()
	for range 100 {
		wg.Go(func() { _, _ = admComplete(qctx, client, p1.base, model, 4, nil) })
	}
	wait.Until(t, "100 requests queued on pod 1", func() bool { return readAdmState(t, rc, model).depth == 100 })

	if err := p1.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	killed := time.Now()
	long[0]() // pod 2 releases one long request; one stays in flight.

	var last admState
	wait.Until(t, "no capacity left taken by the dead pod", func() bool {
		s := readAdmState(t, rc, model)
		if s != last {
			t.Logf("%v after SIGKILL: %+v", time.Since(killed).Round(time.Millisecond), s)
		}
		last = s
		return last.depth == 0 && last.booked == 1 && last.leases == 1
	})
	took := time.Since(killed)
	t.Logf("SIGKILL to no capacity taken: %v (depth %d, booked %d, lease bodies %d)", took.Round(time.Millisecond), last.depth, last.booked, last.leases)
	if took > bound {
		t.Errorf("capacity back after %v, want within %v", took, bound)
	}
	if got := admRoute(t, p2.base, model); got != http.StatusOK {
		t.Errorf("new request on pod 2: got %d, want 200", got)
	}
}

// startIngest runs one `kvroute ingest` against url, stopped when t ends.
func startIngest(t *testing.T, bin, url string) {
	t.Helper()
	startAdmProc(t, bin, "ingest", "ingest", "--redis-url", url, "--metrics-listen", "127.0.0.1:"+strconv.Itoa(freePort(t)))
}

// admOutcome is what one request of TestAdmissionExactlyOnce ended as.
type admOutcome int

const (
	outOK admOutcome = iota
	outShed
	outNoReplica
	outGone
	outOther
)

// TestAdmissionExactlyOnce: a burst of 300 requests over three pods
// against two sim-replicas of two requests each; a third of the clients
// cancel while they wait, a third bound their wait to 100 ms. Each
// request ends exactly once as 200, 429, 503 or client gone, and after
// the load drains no ticket and no booking is left, with no ingestor's
// sweep (KVROUTE_ADM_INGEST=1 adds one): the pods' beats give back what
// requests that left held.
func TestAdmissionExactlyOnce(t *testing.T) {
	const model, n = "demo", 300
	bin := kvrouteBinary(t)
	url, rc := loadRedis(t)
	pods := startPods(t, bin, url, 3, "--max-requests", "2", "--queue-ttl", "20s")
	if os.Getenv("KVROUTE_ADM_INGEST") != "" {
		startIngest(t, bin, url) // Its sweep: see TestAdmissionPodKilled.
	}
	admSims(t, bin, pods[0].base, model, 2, "--decode-tokens-per-sec", "400")
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 512}}

	outs := make([]admOutcome, n)
	var ended [n]atomic.Int32
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var hdr map[string]string
			switch i % 3 {
			case 0:
				time.AfterFunc(time.Duration(50+i%250)*time.Millisecond, cancel)
			case 1:
				hdr = map[string]string{"X-Kvroute-Max-Wait-Ms": "100"}
			}
			code, err := admComplete(ctx, client, pods[i%3].base, model, 20, hdr)
			ended[i].Add(1)
			switch {
			case err != nil && errors.Is(err, context.Canceled):
				outs[i] = outGone
			case code == http.StatusOK:
				outs[i] = outOK
			case code == http.StatusTooManyRequests:
				outs[i] = outShed
			case code == http.StatusServiceUnavailable:
				outs[i] = outNoReplica
			default:
				t.Errorf("request %d: got status %d err %v, want 200, 429, 503 or client gone", i, code, err)
				outs[i] = outOther
			}
		})
	}
	wg.Wait()
	count := map[admOutcome]int{}
	for i := range n {
		if got := ended[i].Load(); got != 1 {
			t.Errorf("request %d ended %d times, want 1", i, got)
		}
		count[outs[i]]++
	}
	t.Logf("outcomes of %d: 200 %d, 429 %d, 503 %d, client gone %d, other %d", n,
		count[outOK], count[outShed], count[outNoReplica], count[outGone], count[outOther])
	if count[outOK] == 0 || count[outOK]+count[outShed]+count[outNoReplica]+count[outGone] != n {
		t.Errorf("outcomes %v do not add up to %d with some served", count, n)
	}
	var last admState
	drained := time.Now()
	wait.Until(t, "queue empty and no booking left", func() bool {
		s := readAdmState(t, rc, model)
		if s != last {
			t.Logf("%v after the last answer: %+v", time.Since(drained).Round(time.Millisecond), s)
		}
		last = s
		return last == admState{}
	})
}

// TestAdmissionScaleFromZero: model "cold" is declared (--model-limits)
// with no replica; 20 requests wait for one (--cold-start 30s). 3 s
// later (the event under test, so a wall-clock wait) a sim-replica is
// started and registered; all 20 are then served, none 503.
func TestAdmissionScaleFromZero(t *testing.T) {
	const model, n = "cold", 20
	bin := kvrouteBinary(t)
	url, rc := loadRedis(t)
	p := startPods(t, bin, url, 1, "--model-limits", model+":max_requests=4", "--cold-start", "30s")[0]
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}

	codes := make([]int, n)
	done := make([]time.Time, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			codes[i], _ = admComplete(context.Background(), client, p.base, model, 8, nil)
			done[i] = time.Now()
		})
	}
	wait.Until(t, "20 requests waiting for a replica", func() bool { return readAdmState(t, rc, model).depth == n })
	time.Sleep(3 * time.Second) // The scenario: the replica comes up 3 s later.
	reg := time.Now()
	admSims(t, bin, p.base, model, 1, "--decode-tokens-per-sec", "0")
	wg.Wait()
	var lastDone time.Time
	for i := range n {
		if codes[i] != http.StatusOK {
			t.Errorf("request %d: got %d, want 200", i, codes[i])
		}
		if done[i].After(lastDone) {
			lastDone = done[i]
		}
	}
	t.Logf("replica start+registration to all %d served: %v", n, lastDone.Sub(reg).Round(time.Millisecond))
}

// BenchmarkAdmissionCost is what admission costs a decision when no limit
// binds: two sets of three `kvroute serve` pods over one redis-server and
// one fleet (loadCorpus, 8 replicas × 64 blocks), one with admission on
// (the default) and one with --admission=false, measured in alternating
// closed-loop phases of POST /v1/route with token_ids from 4 clients.
// Figures: p50 on/off and Redis CPU per decision on/off, both INFO cpu's
// used_cpu_sys+used_cpu_user (redis-cpu) and the main thread's (redis-main-cpu);
// the idle set's background work (beats, heartbeats) falls in every phase.
//
//	go test -run '^$' -bench AdmissionCost -benchtime 1x ./tests/
func BenchmarkAdmissionCost(b *testing.B) {
	bin := loadBinary(b)
	for b.Loop() {
		url, rc, _, prompts := loadFixture(b, 8, 64)
		var bodies [][]byte
		for _, p := range prompts {
			raw, _ := json.Marshal(map[string]any{"model": "bench", "token_ids": p, "max_tokens": 64})
			bodies = append(bodies, raw)
		}
		tr := &http.Transport{MaxIdleConnsPerHost: 64}
		client := &http.Client{Transport: tr, Timeout: 30 * time.Second}
		gen := map[bool]*loadGen{}
		for _, on := range []bool{true, false} {
			pods := startPods(b, bin, url, 3, "--admission="+strconv.FormatBool(on))
			gen[on] = &loadGen{tb: b, pods: pods, bodies: bodies, client: client, rc: rc}
			gen[on].closed("warm-up", 4, 400, 2*time.Second)
		}
		secs := time.Duration(envInt("KVROUTE_LOAD_SECS", 3)) * time.Second
		agg := map[bool]*phase{true: {}, false: {}}
		for round := range 6 {
			on := round%2 == 0
			cpu0 := redisProcCPU(b, rc)
			ph := gen[on].closed(fmt.Sprintf("on=%v", on), 4, 1<<30, secs)
			agg[on].podCPU += redisProcCPU(b, rc) - cpu0 // the whole process's, in podCPU's slot
			if ph.errs > 0 {
				b.Errorf("admission=%v: %d of %d decisions failed", on, ph.errs, ph.sent)
			}
			a := agg[on]
			a.ok += ph.ok
			a.lat = append(a.lat, ph.lat...)
			a.redisCPU += ph.redisCPU
		}
		perDec := func(p *phase) float64 { return us(p.redisCPU) / float64(max(p.ok, 1)) }
		perDecAll := func(p *phase) float64 { return us(p.podCPU) / float64(max(p.ok, 1)) }
		on, off := agg[true], agg[false]
		b.Logf("admission on:  %d decisions, p50 %.0f µs, p99 %.0f µs, Redis main thread %.1f µs, process %.1f µs CPU/decision", on.ok, us(on.pct(0.5)), us(on.pct(0.99)), perDec(on), perDecAll(on))
		b.Logf("admission off: %d decisions, p50 %.0f µs, p99 %.0f µs, Redis main thread %.1f µs, process %.1f µs CPU/decision", off.ok, us(off.pct(0.5)), us(off.pct(0.99)), perDec(off), perDecAll(off))
		b.ReportMetric(float64(on.pct(0.5))/float64(off.pct(0.5)), "p50-on/off")
		b.ReportMetric(perDec(on)/perDec(off), "redis-main-cpu-on/off")
		b.ReportMetric(perDecAll(on)/perDecAll(off), "redis-cpu-on/off")
	}
}

// redisProcCPU is INFO cpu's used_cpu_sys + used_cpu_user: the whole
// redis-server process, its background threads included.
func redisProcCPU(tb testing.TB, rc *redis.Client) time.Duration {
	info, err := rc.Info(context.Background(), "cpu").Result()
	if err != nil {
		tb.Fatal(err)
	}
	var d time.Duration
	for _, line := range strings.Split(info, "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), ":"); ok && (k == "used_cpu_sys" || k == "used_cpu_user") {
			f, _ := strconv.ParseFloat(v, 64)
			d += time.Duration(f * float64(time.Second))
		}
	}
	return d
}
