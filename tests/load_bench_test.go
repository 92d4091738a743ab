package tests_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
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
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/testfiles"
	"github.com/kvroute/kvroute/store"
	"github.com/redis/go-redis/v9"
)

// BenchmarkLoad is the throughput ceiling of one Redis shard, measured end
// to end: real `kvroute serve` processes (built from ./cmd/kvroute) over one
// real redis-server on loopback whose index holds a simulated fleet
// (written through store.Apply, as fleetCorpus does, with several request
// prompts so that picks spread), driven over HTTP by a bounded load
// generator in this process.
//
// Phases, each bounded in count and time: unloaded (one request at a time),
// ceiling (closed loop, many in flight: decisions/s the whole machine
// reaches), then open loop at 25%, 50% and 90% of that ceiling (latency is
// measured from each request's scheduled start, so a stalled server cannot
// hide its queue). In the same run: redis-benchmark GET against the same
// server, and the pod-side floor (JSON-decoding the same /v1/route body and
// keying its tokens, in this process).
//
// Figures: decisions per pod CPU-second (utime+stime of the pod processes
// from /proc), Redis main-thread CPU µs per decision (INFO cpu) and the
// scripts' µs per decision (INFO commandstats, evalsha), p50/p99 per phase.
// The Redis-bound ceiling is 1e6 / (Redis main-thread µs per decision).
//
//	go test -run '^$' -bench Load -benchtime 1x -timeout 20m ./tests/
//
// KVROUTE_LOAD_PODS (default 3) sets the number of pods, KVROUTE_LOAD_SECS
// (default 4) the length of each phase, KVROUTE_BIN a prebuilt binary;
// KVROUTE_LOAD_READS=replica gives the pods a replica of the server for
// their lookups' reads (--redis-read-url), and (a) is then the pair's;
// KVROUTE_LOAD_SKELETON=1 also runs the ceiling phase on skeleton pods
// (skeleton_test.go) and reports their CPU per request beside kvroute's.
//
// KVROUTE_BIN_BEFORE names a second binary (an earlier commit's) to measure
// in the same run, before this tree's: build=before and build=after.
func BenchmarkLoad(b *testing.B) {
	bins := []struct{ name, path string }{{"", loadBinary(b)}}
	if p := os.Getenv("KVROUTE_BIN_BEFORE"); p != "" {
		bins = []struct{ name, path string }{{"/build=before", p}, {"/build=after", bins[0].path}}
	}
	for _, shape := range []struct{ reps, blocks int }{{64, 2048}, {8, 64}} {
		for _, bin := range bins {
			b.Run(fmt.Sprintf("replicas=%d/blocks=%d%s", shape.reps, shape.blocks, bin.name), func(b *testing.B) {
				for b.Loop() {
					runLoad(b, bin.path, shape.reps, shape.blocks)
				}
			})
		}
	}
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

func loadBinary(tb testing.TB) string {
	if p := os.Getenv("KVROUTE_BIN"); p != "" {
		return p
	}
	p := filepath.Join(tb.TempDir(), "kvroute")
	cmd := exec.Command("go", "build", "-o", p, "./cmd/kvroute")
	cmd.Dir = testfiles.Root()
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("build kvroute: %v\n%s", err, out)
	}
	return p
}

func freePort(tb testing.TB) int {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// loadRedis starts a redis-server of its own (persistence off) and returns
// its URL and a client.
func loadRedis(tb testing.TB) (string, *redis.Client) {
	port := freePort(tb)
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", tb.TempDir())
	if err := cmd.Start(); err != nil {
		tb.Fatalf("redis-server: %v", err)
	}
	tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(port)})
	tb.Cleanup(func() { rc.Close() })
	deadline := time.Now().Add(10 * time.Second)
	for rc.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			tb.Fatal("redis-server did not answer")
		}
		time.Sleep(10 * time.Millisecond)
	}
	return "redis://127.0.0.1:" + strconv.Itoa(port), rc
}

type loadPod struct {
	base string
	cmd  *exec.Cmd
	log  string // the file its stderr goes to
}

// startPods runs n `kvroute serve` processes against url, each on a port
// picked here, logs (the default access log: every error, one in a
// hundred of the rest) to a
// file, and waits until each answers /readyz.
func startPods(tb testing.TB, bin, url string, n int, extra ...string) []*loadPod {
	return startProcs(tb, n, func(addr string) *exec.Cmd {
		return exec.Command(bin, append([]string{"serve", "--listen", addr, "--redis-url", url, "--log-format", "json"}, extra...)...)
	})
}

// startProcs runs n processes, each made by mk for a loopback address
// picked here, with stderr to a log file; it waits until each answers
// /readyz and stops them (SIGTERM, then SIGKILL) when tb ends.
func startProcs(tb testing.TB, n int, mk func(addr string) *exec.Cmd) []*loadPod {
	var pods []*loadPod
	dir := tb.TempDir()
	for i := range n {
		addr := "127.0.0.1:" + strconv.Itoa(freePort(tb))
		logPath := filepath.Join(dir, fmt.Sprintf("pod%d.log", i))
		logf, err := os.Create(logPath)
		if err != nil {
			tb.Fatal(err)
		}
		cmd := mk(addr)
		cmd.Stdout, cmd.Stderr = io.Discard, logf
		if err := cmd.Start(); err != nil {
			tb.Fatal(err)
		}
		p := &loadPod{base: "http://" + addr, cmd: cmd, log: logPath}
		pods = append(pods, p)
		tb.Cleanup(func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(15 * time.Second):
				_ = cmd.Process.Kill()
				<-done
			}
			logf.Close()
		})
	}
	deadline := time.Now().Add(60 * time.Second)
	for _, p := range pods {
		for {
			resp, err := http.Get(p.base + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					break
				}
			}
			if time.Now().After(deadline) {
				tb.Fatalf("pod %s not ready: %v", p.base, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	return pods
}

// procCPU is a process's utime+stime from /proc/<pid>/stat.
func procCPU(tb testing.TB, pid int) time.Duration {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		tb.Fatal(err)
	}
	// Fields after the command name (which may hold spaces) start at ')'.
	f := strings.Fields(string(raw[bytes.LastIndexByte(raw, ')')+2:]))
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / 100 // USER_HZ
}

func podsCPU(tb testing.TB, pods []*loadPod) time.Duration {
	var t time.Duration
	for _, p := range pods {
		t += procCPU(tb, p.cmd.Process.Pid)
	}
	return t
}

// redisStats is the part of INFO the benchmark reads: main-thread CPU and
// per-command calls and µs.
type redisStats struct {
	cpu   time.Duration
	usec  map[string]int64
	calls map[string]int64
	// reads and writes are the socket reads and reply writes Redis made
	// (INFO stats): one of each per round trip, however many commands
	// it carried.
	reads, writes int64
}

func readRedisStats(tb testing.TB, rc *redis.Client) redisStats {
	info, err := rc.Info(context.Background(), "cpu", "commandstats", "stats").Result()
	if err != nil {
		tb.Fatal(err)
	}
	s := redisStats{usec: map[string]int64{}, calls: map[string]int64{}}
	for _, line := range strings.Split(info, "\n") {
		line = strings.TrimSpace(line)
		if k, v, ok := strings.Cut(line, ":"); ok {
			switch k {
			case "used_cpu_sys_main_thread", "used_cpu_user_main_thread":
				f, _ := strconv.ParseFloat(v, 64)
				s.cpu += time.Duration(f * float64(time.Second))
			case "total_reads_processed":
				s.reads, _ = strconv.ParseInt(v, 10, 64)
			case "total_writes_processed":
				s.writes, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		rest, ok := strings.CutPrefix(line, "cmdstat_")
		if !ok {
			continue
		}
		name, kvs, _ := strings.Cut(rest, ":")
		for _, kv := range strings.Split(kvs, ",") {
			k, v, _ := strings.Cut(kv, "=")
			n, _ := strconv.ParseInt(v, 10, 64)
			switch k {
			case "calls":
				s.calls[name] = n
			case "usec":
				s.usec[name] = n
			}
		}
	}
	return s
}

// loadCorpus writes a fleet like fleetCorpus's, with nPrompts request
// prompts: every replica holds the 4-block system prompt and 64 blocks of
// unrelated conversation; for each prompt a quarter of the replicas (a
// different quarter for consecutive prompts) hold its prefix to random
// depths between half and all of it. Every lookup therefore meets the same
// number of distinct match lengths as fleetCorpus's one prompt.
func loadCorpus(tb testing.TB, ctx context.Context, st *store.Store, nRep, nBlocks, nPrompts int) [][]uint32 {
	const bs = kvroute.DefaultBlockSize
	r := rand.New(rand.NewPCG(uint64(nRep), uint64(nBlocks)))
	toks := func(n int) []uint32 { return randTokens(r, n) }
	ks := kvroute.KeySpace{Model: "bench"}
	sys := toks(4 * bs)
	var prompts [][]uint32
	var keys [][]kvroute.BlockKey
	for range nPrompts {
		p := append(append([]uint32(nil), sys...), toks((nBlocks-4)*bs)...)
		prompts = append(prompts, p)
		keys = append(keys, kvroute.BlockKeys(ks, bs, p, nil))
	}
	for i := range nRep {
		id := fmt.Sprintf("r%03d", i)
		if err := st.PutReplica(ctx, kvroute.Replica{ID: id, Model: "bench", URL: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:1"}); err != nil {
			tb.Fatal(err)
		}
		chains := [][]kvroute.BlockKey{keys[0][:4]}
		for p := range nPrompts {
			if (i+p)%4 == 0 {
				chains = append(chains, keys[p][:nBlocks/2+r.IntN(nBlocks/2+1)])
			}
		}
		chains = append(chains, kvroute.BlockKeys(ks, bs, append(append([]uint32(nil), sys...), toks(64*bs)...), nil))
		seq := int64(0)
		for _, chain := range chains {
			seq = holdChain(tb, ctx, st, "bench", id, chain, seq, func(j int) uint64 { return uint64(chain[j]) ^ uint64(i)<<56 ^ uint64(j) })
		}
	}
	return prompts
}

// phase is what one load phase measured.
type phase struct {
	name       string
	target     float64 // requests/s asked (0: closed loop)
	sent, ok   int
	errs       int
	cacheAware int // answers that were not degraded and matched > 0 blocks
	elapsed    time.Duration
	lat        []time.Duration
	podCPU     time.Duration
	redisCPU   time.Duration
	replicaCPU time.Duration // the read replica's, when the pods have one
	scriptUsec int64
	cmdUsec    map[string]int64
	cmdCalls   map[string]int64
	dropped    int // open loop: arrivals not sent because too many were in flight
}

// record counts one answered request: ok a 200, aware cache-aware, took
// its latency. The caller serializes calls.
func (p *phase) record(ok, aware bool, took time.Duration) {
	p.sent++
	if !ok {
		p.errs++
		return
	}
	p.ok++
	p.lat = append(p.lat, took)
	if aware {
		p.cacheAware++
	}
}

func (p *phase) rate() float64 { return float64(p.ok) / p.elapsed.Seconds() }

func (p *phase) pct(q float64) time.Duration {
	if len(p.lat) == 0 {
		return 0
	}
	s := slices.Clone(p.lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

type loadGen struct {
	tb     testing.TB
	pods   []*loadPod
	bodies [][]byte
	client *http.Client
	rc     *redis.Client
	// replica is the pods' read replica (KVROUTE_LOAD_READS=replica); nil
	// when they read from the primary.
	replica *redis.Client
	next    atomic.Uint64
}

// one sends the next body to the next pod and reports whether it was a
// cache-aware 200.
func (g *loadGen) one() (ok, aware bool) {
	i := g.next.Add(1)
	p := g.pods[i%uint64(len(g.pods))]
	body := g.bodies[(i/uint64(len(g.pods)))%uint64(len(g.bodies))]
	req, _ := http.NewRequest(http.MethodPost, p.base+"/v1/route", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.client.Do(req)
	if err != nil {
		return false, false
	}
	raw, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return false, false
	}
	var d struct {
		Degraded      bool `json:"degraded"`
		MatchedBlocks int  `json:"matched_blocks"`
	}
	_ = json.Unmarshal(raw, &d)
	return true, !d.Degraded && d.MatchedBlocks > 0
}

// measure runs f between two readings of every CPU and Redis counter.
func (g *loadGen) measure(name string, target float64, f func(ph *phase)) *phase {
	ph := &phase{name: name, target: target}
	c0, r0 := podsCPU(g.tb, g.pods), readRedisStats(g.tb, g.rc)
	var q0, q1 redisStats
	if g.replica != nil {
		q0 = readRedisStats(g.tb, g.replica)
	}
	t0 := time.Now()
	f(ph)
	ph.elapsed = time.Since(t0)
	c1, r1 := podsCPU(g.tb, g.pods), readRedisStats(g.tb, g.rc)
	if g.replica != nil {
		q1 = readRedisStats(g.tb, g.replica)
	}
	ph.podCPU, ph.redisCPU, ph.replicaCPU = c1-c0, r1.cpu-r0.cpu, q1.cpu-q0.cpu
	ph.cmdUsec, ph.cmdCalls = map[string]int64{}, map[string]int64{}
	for k, v := range r1.usec {
		ph.cmdUsec[k] = v - r0.usec[k]
		ph.cmdCalls[k] = r1.calls[k] - r0.calls[k]
	}
	ph.scriptUsec = ph.cmdUsec["evalsha"] + ph.cmdUsec["evalsha_ro"] + ph.cmdUsec["eval"] + ph.cmdUsec["eval_ro"]
	return ph
}

// closed runs workers request loops until count answers or d has passed.
func (g *loadGen) closed(name string, workers, count int, d time.Duration) *phase {
	return g.measure(name, 0, func(ph *phase) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		var left atomic.Int64
		left.Store(int64(count))
		stop := time.Now().Add(d)
		for range workers {
			wg.Go(func() {
				for left.Add(-1) >= 0 && time.Now().Before(stop) {
					t0 := time.Now()
					ok, aware := g.one()
					el := time.Since(t0)
					mu.Lock()
					ph.record(ok, aware, el)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
	})
}

// open sends requests at rate per second, evenly spaced, for d (at most
// rate*d of them), each timed from its scheduled start; an arrival finding
// maxInFlight requests outstanding is dropped and counted.
func (g *loadGen) open(name string, rate float64, d time.Duration, maxInFlight int) *phase {
	return g.measure(name, rate, func(ph *phase) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		var inflight atomic.Int64
		n := int(rate * d.Seconds())
		gap := time.Duration(float64(time.Second) / rate)
		start := time.Now()
		for i := range n {
			at := start.Add(time.Duration(i) * gap)
			if w := time.Until(at); w > 0 {
				time.Sleep(w)
			}
			if inflight.Load() >= int64(maxInFlight) {
				ph.dropped++
				continue
			}
			inflight.Add(1)
			wg.Go(func() {
				defer inflight.Add(-1)
				ok, aware := g.one()
				el := time.Since(at)
				mu.Lock()
				defer mu.Unlock()
				ph.record(ok, aware, el)
			})
		}
		wg.Wait()
	})
}

// decodeFloor is the pod's unavoidable work per decision, in this process:
// decoding the /v1/route body as the handler does (api.DecodeRouteRequest:
// the strict scan parses the token ids in the same pass) and keying its
// tokens. CPU per op from getrusage.
func decodeFloor(tb testing.TB, body []byte, n int) time.Duration {
	ru := func() time.Duration {
		var u syscall.Rusage
		_ = syscall.Getrusage(syscall.RUSAGE_SELF, &u)
		return time.Duration(u.Utime.Nano() + u.Stime.Nano())
	}
	runtime.GC()
	c0 := ru()
	for range n {
		req, err := api.DecodeRouteRequest(body)
		if err != nil {
			tb.Fatal(err)
		}
		kvroute.BlockKeys(kvroute.KeySpace{Model: req.Model}, kvroute.DefaultBlockSize, req.TokenIDs, nil)
	}
	return (ru() - c0) / time.Duration(n)
}

// redisBenchmarkGet runs the brief's reference against the same server.
func redisBenchmarkGet(tb testing.TB, url string) (float64, time.Duration, *redisStats) {
	u := strings.TrimPrefix(url, "redis://")
	host, port, _ := net.SplitHostPort(u)
	opt, _ := redis.ParseURL(url)
	rc := redis.NewClient(opt)
	defer rc.Close()
	r0 := readRedisStats(tb, rc)
	out, err := exec.Command("redis-benchmark", "-h", host, "-p", port, "-t", "get", "-c", "50", "-P", "1", "-n", "200000", "-q").CombinedOutput()
	if err != nil {
		tb.Fatalf("redis-benchmark: %v\n%s", err, out)
	}
	r1 := readRedisStats(tb, rc)
	// "GET: 61050.06 requests per second, p50=0.407 msec"; -q prints
	// progress with carriage returns first.
	s := string(out)
	if i := strings.LastIndex(s, "GET: "); i >= 0 {
		s = s[i+5:]
	}
	f, _ := strconv.ParseFloat(strings.Fields(s)[0], 64)
	calls := r1.calls["get"] - r0.calls["get"]
	var cpuPer time.Duration
	if calls > 0 {
		cpuPer = (r1.cpu - r0.cpu) / time.Duration(calls)
	}
	return f, cpuPer, &r1
}

// loadFixture is the load benchmarks' setup: a redis-server of their own,
// a store on it (closed when the benchmark ends), and loadCorpus's fleet
// with 8 request prompts.
func loadFixture(b *testing.B, nRep, nBlocks int) (string, *redis.Client, *store.Store, [][]uint32) {
	url, rc := loadRedis(b)
	st, err := store.Open(context.Background(), url, store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	t0 := time.Now()
	prompts := loadCorpus(b, context.Background(), st, nRep, nBlocks, 8)
	b.Logf("corpus: %d replicas × %d blocks, %d prompts, written in %v", nRep, nBlocks, len(prompts), time.Since(t0).Round(time.Millisecond))
	return url, rc, st, prompts
}

func runLoad(b *testing.B, bin string, nRep, nBlocks int) {
	nPods := envInt("KVROUTE_LOAD_PODS", 3)
	secs := time.Duration(envInt("KVROUTE_LOAD_SECS", 4)) * time.Second
	url, rc, _, prompts := loadFixture(b, nRep, nBlocks)
	var bodies [][]byte
	for _, p := range prompts {
		raw, _ := json.Marshal(map[string]any{"model": "bench", "token_ids": p, "max_tokens": 64})
		bodies = append(bodies, raw)
	}
	// KVROUTE_LOAD_READS=replica gives the pods a replica of the server
	// for their lookups' reads (--redis-read-url).
	var extra []string
	var replica *redis.Client
	if os.Getenv("KVROUTE_LOAD_READS") == "replica" {
		addr := redistest.Replica(b, strings.TrimPrefix(url, "redis://"))
		replica = redis.NewClient(&redis.Options{Addr: addr})
		b.Cleanup(func() { replica.Close() })
		extra = []string{"--redis-read-url", "redis://" + addr}
	}
	pods := startPods(b, bin, url, nPods, extra...)
	tr := &http.Transport{MaxIdleConns: 4096, MaxIdleConnsPerHost: 1024, IdleConnTimeout: time.Minute}
	defer tr.CloseIdleConnections()
	g := &loadGen{tb: b, pods: pods, bodies: bodies, client: &http.Client{Transport: tr, Timeout: 30 * time.Second}, rc: rc, replica: replica}

	floor := decodeFloor(b, bodies[0], 1000)
	g.closed("warm-up", 8, 400, secs)
	unloaded := g.closed("unloaded", 1, 400, secs)
	ceil := g.closed("ceiling", 16*nPods, 1<<30, secs)
	if ceil.ok == 0 {
		b.Fatalf("no decision answered: %d errors", ceil.errs)
	}
	phases := []*phase{unloaded, ceil}
	for _, f := range []float64{0.25, 0.5, 0.9} {
		phases = append(phases, g.open(fmt.Sprintf("%.0f%%", 100*f), f*ceil.rate(), secs, 1024))
	}
	getRPS, getCPU, _ := redisBenchmarkGet(b, url)
	// The skeleton (skeleton_test.go): the same load on processes doing
	// only the HTTP and Redis work, for what of (b) is the machine's.
	var skel *phase
	if os.Getenv("KVROUTE_LOAD_SKELETON") != "" {
		sg := &loadGen{tb: b, pods: startSkeletons(b, url, nRep, nPods), bodies: bodies, client: g.client, rc: rc}
		sg.closed("skeleton warm-up", 8, 400, secs)
		skelIdle := sg.closed("skeleton unloaded", 1, 400, secs)
		skel = sg.closed("skeleton", 16*nPods, 1<<30, secs)
		skelHalf := sg.open("skeleton 50%", 0.5*skel.rate(), secs, 1024)
		// (c) of the skeleton: the tail the machine itself adds at half
		// its ceiling, with no kvroute code in the pods.
		b.Logf("skeleton: unloaded p50 %.0f µs; at 50%% of its ceiling p50 %.0f µs, p99 %.0f µs (%d dropped)",
			us(skelIdle.pct(0.5)), us(skelHalf.pct(0.5)), us(skelHalf.pct(0.99)), skelHalf.dropped)
		b.ReportMetric(float64(skelHalf.pct(0.99))/float64(skelIdle.pct(0.5)), "skeleton-c")
	}

	b.Logf("pods: %d kvroute serve processes; machine: %d CPUs; pod floor (decode+key): %.0f µs CPU", nPods, runtime.NumCPU(), us(floor))
	b.Logf("redis-benchmark GET -c 50: %.0f req/s, Redis main thread %.2f µs CPU per GET", getRPS, us(getCPU))
	b.Logf("%-9s %8s %7s %6s %6s %9s %9s %9s %10s %10s %8s %8s %11s", "phase", "target/s", "dec/s", "errs", "drop", "aware", "pod-µs", "dec/s/core", "redis-µs", "script-µs", "p50-µs", "p99-µs", "evalsha/dec")
	for _, ph := range phases {
		n := float64(max(ph.ok, 1))
		b.Logf("%-9s %8.0f %7.0f %6d %6d %9d %9.0f %9.0f %10.1f %10.1f %8.0f %8.0f %11.2f", ph.name, ph.target, ph.rate(), ph.errs, ph.dropped, ph.cacheAware,
			us(ph.podCPU)/n, n/ph.podCPU.Seconds(), us(ph.redisCPU)/n, float64(ph.scriptUsec)/n, us(ph.pct(0.5)), us(ph.pct(0.99)),
			float64(ph.cmdCalls["evalsha"]+ph.cmdCalls["evalsha_ro"])/n)
	}
	var cmds []string
	for k, v := range ceil.cmdCalls {
		if v > 0 {
			cmds = append(cmds, fmt.Sprintf("%s %.2f calls %.1f µs", k, float64(v)/float64(ceil.ok), float64(ceil.cmdUsec[k])/float64(ceil.ok)))
		}
	}
	slices.Sort(cmds)
	b.Logf("per decision at the ceiling (commandstats; commands called by scripts counted too): %s", strings.Join(cmds, "; "))

	redisPer := ceil.redisCPU.Seconds() / float64(ceil.ok)
	redisCeil := 1 / redisPer
	if replica != nil {
		// The shard is the pair: its ceiling is the busier one's.
		replicaPer := ceil.replicaCPU.Seconds() / float64(ceil.ok)
		redisCeil = 1 / max(redisPer, replicaPer)
		b.Logf("read replica at the ceiling: %.1f µs CPU per decision (the primary %.1f)", replicaPer*1e6, redisPer*1e6)
		b.ReportMetric(replicaPer*1e6, "replica-µs/dec")
	}
	podPer := ceil.podCPU / time.Duration(ceil.ok)
	half := phases[3]
	b.ReportMetric(ceil.rate(), "ceiling-dec/s")
	b.ReportMetric(float64(ceil.ok)/ceil.podCPU.Seconds(), "dec/s/pod-core")
	b.ReportMetric(redisPer*1e6, "redis-µs/dec")
	b.ReportMetric(float64(ceil.scriptUsec)/float64(ceil.ok), "script-µs/dec")
	b.ReportMetric(redisCeil, "redis-bound-dec/s")
	b.ReportMetric(getRPS, "get-rps")
	b.ReportMetric(redisCeil/getRPS, "a:shard-ceiling/get")
	b.ReportMetric(float64(podPer)/float64(floor), "b:pod-cpu/floor")
	b.ReportMetric(float64(half.pct(0.99))/float64(unloaded.pct(0.5)), "c:p99@50%/unloaded-p50")
	if skel != nil && skel.ok > 0 {
		skelPer := skel.podCPU / time.Duration(skel.ok)
		b.Logf("skeleton at its ceiling: %.0f req/s, %.0f µs pod CPU a request (kvroute %.0f µs, floor %.0f µs)", skel.rate(), us(skelPer), us(podPer), us(floor))
		b.ReportMetric(us(skelPer), "skeleton-µs/req")
		b.ReportMetric(float64(skelPer)/float64(floor), "skeleton/floor")
		b.ReportMetric(float64(podPer)/float64(skelPer), "pod/skeleton")
	}
	for _, ph := range phases {
		if ph.errs > 0 || ph.dropped > 0 {
			b.Logf("phase %s: %d errors, %d dropped", ph.name, ph.errs, ph.dropped)
		}
	}
}

func us(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }

// BenchmarkLoadLookup is BenchmarkLoad's corpus without pods: Lookup and
// Reserve from this process, one at a time, so that Redis's own time per
// decision can be read without the pods competing for the machine's CPUs.
func BenchmarkLoadLookup(b *testing.B) {
	for _, hints := range []bool{false, true} {
		b.Run(fmt.Sprintf("replicas=64/blocks=2048/hints=%v", hints), func(b *testing.B) {
			ctx := context.Background()
			url, rc := loadRedis(b)
			st, err := store.Open(ctx, url, store.Options{NoLookupHints: !hints})
			if err != nil {
				b.Fatal(err)
			}
			defer st.Close()
			prompts := loadCorpus(b, ctx, st, 64, 2048, 8)
			var keys [][]kvroute.BlockKey
			for _, p := range prompts {
				keys = append(keys, kvroute.BlockKeys(kvroute.KeySpace{Model: "bench"}, kvroute.DefaultBlockSize, p, nil))
			}
			ids := make([]string, 64)
			for i := range ids {
				ids[i] = fmt.Sprintf("r%03d", i)
			}
			r0 := readRedisStats(b, rc)
			n := 0
			for b.Loop() {
				_, loads, err := st.Lookup(ctx, "bench", keys[n%len(keys)], ids)
				if err != nil {
					b.Fatal(err)
				}
				l := kvroute.Lease{RequestID: store.RequestID("bench", strconv.Itoa(n)), Model: "bench", Replica: ids[n%64], PrefillBlocks: 1, DecodeBlocks: 1, Expires: time.Now().Add(time.Minute)}
				if _, _, err := st.Reserve(ctx, l, loads[n%64].Version); err != nil {
					b.Fatal(err)
				}
				n++
			}
			r1 := readRedisStats(b, rc)
			b.ReportMetric(us(r1.cpu-r0.cpu)/float64(n), "redis-cpu-µs/dec")
			b.ReportMetric(float64(r1.usec["evalsha"]-r0.usec["evalsha"])/float64(n), "script-µs/dec")
			b.ReportMetric(float64(r1.usec["hmget"]-r0.usec["hmget"])/float64(n), "hmget-µs/dec")
		})
	}
}
