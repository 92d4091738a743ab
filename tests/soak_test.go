package tests_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/wait"
)

const (
	soakModel    = "soak"
	soakReplicas = 3
	soakClients  = 4
	// soakDeadline is every client request's own deadline.
	soakDeadline = 30 * time.Second
	// soakConverge bounds how long, once the clients stopped and the
	// admission state drained, the index may take to agree with every
	// replica's cache.
	// Quiet, an ingestor may notice a stream it lost only at its 30 s
	// silence timeout: hence more than that.
	soakConverge = 45 * time.Second
	// soakBetween is how many requests end between two faults.
	soakBetween = 50
)

// soakStatuses is the documented set a request through a pod may end
// with: served (degraded decisions are 200), shed, replica failed, none
// available.
var soakStatuses = []int{http.StatusOK, http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable}

// soakFleet is the deployment under chaos: a controlled Redis (one
// redis-server, or a Cluster with replicas), two ingestors, three pods,
// soakReplicas sim-replicas.
type soakFleet struct {
	redis   soakRedis
	ingests []*soakProc
	pods    []*soakProc
	podURL  []string
	sims    []*soakProc
	simURL  []string
	proxies []*faultProxy // in front of each replica's HTTP port
	// zproxies are in front of each replica's ZeroMQ sockets (events and
	// replay), between it and the ingestors.
	zproxies []*faultProxy
	// cuts counts replica-side faults (sim kills, link resets), which
	// may cut a response already under way.
	cuts    atomic.Int64
	ids     []string
	regs    []string // each replica's registration body
	live    *liveFleet
	ended   atomic.Int64 // requests ended
	mu      sync.Mutex
	outcome map[string]int
	bad     []string
	faults  map[string]int
	kinds   []string // the faults the schedule draws from
	// nth counts the faults injected; lostAt is nth at the last one that
	// emptied a Redis, and podStart each pod's nth at its last start.
	nth, lostAt atomic.Int64
	podStart    []atomic.Int64
}

// TestSoak is a bounded chaos soak (issue 23): clients send decisions,
// completions (streamed or not) and chat completions through three pods
// while a seeded schedule freezes, restarts (empty) and cuts off Redis (or
// freezes, kills and wipes a Cluster's primaries), kills ingestors, pods
// and sim-replicas, and slows or resets the pods' HTTP and the ingestors'
// ZeroMQ links to the replicas. At the end every request must have ended
// with a documented status within its deadline (or been cut by a kill of
// the pod it was talking to, or been answered 404 by a pod started just as
// the registry was lost, with no copy to re-seed it from), no booking,
// lease or waiter may remain, and within soakConverge the index must hold
// as many blocks as every replica's cache, at its last batch's seq.
func TestSoak(t *testing.T) {
	if os.Getenv("KVROUTE_SOAK") == "" {
		t.Skip("set KVROUTE_SOAK=1 (make soak)")
	}
	seed := uint64(1)
	if s := os.Getenv("KVROUTE_SOAK_SEED"); s != "" {
		n, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("KVROUTE_SOAK_SEED=%q: %v", s, err)
		}
		seed = n
	}
	dur := 60 * time.Second
	if s := os.Getenv("KVROUTE_SOAK_DURATION"); s != "" {
		d, err := time.ParseDuration(s)
		if err != nil {
			t.Fatalf("KVROUTE_SOAK_DURATION=%q: %v", s, err)
		}
		dur = d
	}
	f := startSoakFleet(t)
	f.kinds = append(slices.Clone(soakFaultKinds), f.redis.kinds()...)
	if s := os.Getenv("KVROUTE_SOAK_FAULTS"); s != "" {
		f.kinds = strings.Split(s, ",")
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i := range soakClients {
		wg.Go(func() { f.client(t, rand.New(rand.NewPCG(seed, uint64(i+1))), stop) })
	}
	lastFault := f.chaos(t, rand.New(rand.NewPCG(seed, 0)), dur)
	close(stop)
	wg.Wait()
	t.Logf("seed %d, %v: faults %v; requests by outcome %v", seed, dur, f.faults, f.outcome)
	for _, b := range f.bad {
		t.Errorf("request outside the documented outcomes: %s", b)
	}
	f.live.waitDrained(t)
	drained := time.Now()
	t.Logf("admission state drained %v after the last fault ended", drained.Sub(lastFault).Round(time.Millisecond))
	converged := f.waitConverged(t)
	t.Logf("index agreed with every replica %v after that (%v after the last fault)",
		converged.Sub(drained).Round(time.Millisecond), converged.Sub(lastFault).Round(time.Millisecond))
	believed, served := f.cachedTokens(t)
	var b, s, phantom float64
	for r, v := range believed {
		b, s, phantom = b+v, s+served[r], phantom+max(0, v-served[r])
	}
	if b > 0 {
		t.Logf("phantom hits: the index believed %.0f cached prompt tokens, the replicas served %.0f; believed beyond served, replica by replica: %.0f (%.1f%%; the pods' counters since their last start)",
			b, s, phantom, 100*phantom/b)
	}
}

// cachedTokens sums, over the pods, per replica, the cached prompt tokens
// the index believed the chosen replica held and those the replicas
// reported serving from their cache, for proxied responses: believed
// beyond served is the phantom hits. A pod killed by the schedule counts
// from its restart.
func (f *soakFleet) cachedTokens(t *testing.T) (believed, served map[string]float64) {
	t.Helper()
	believed, served = map[string]float64{}, map[string]float64{}
	for _, u := range f.podURL {
		resp, err := http.Get(u + "/metrics")
		if err != nil {
			t.Errorf("%s/metrics: %v", u, err)
			continue
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, line := range strings.Split(string(raw), "\n") {
			name, val, ok := strings.Cut(line, " ")
			if !ok {
				continue
			}
			v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
			_, rep, _ := strings.Cut(name, `replica="`)
			rep, _, _ = strings.Cut(rep, `"`)
			switch {
			case err != nil:
			case strings.HasPrefix(name, "kvroute_cached_tokens_believed_total"):
				believed[rep] += v
			case strings.HasPrefix(name, "kvroute_cached_tokens_served_total"):
				served[rep] += v
			}
		}
	}
	return believed, served
}

// soakBoundedTB is t with a nearer deadline, which bounds wait's waits.
type soakBoundedTB struct {
	testing.TB
	deadline time.Time
}

func (b soakBoundedTB) Deadline() (time.Time, bool) { return b.deadline, true }

// startSoakFleet starts the processes and registers the replicas with
// their events and replay endpoints, and waits until all are followed.
func startSoakFleet(t *testing.T) *soakFleet {
	t.Helper()
	bin := kvrouteBinary(t)
	f := &soakFleet{redis: startSoakRedis(t), outcome: map[string]int{}, faults: map[string]int{}, podStart: make([]atomic.Int64, 3)}
	rf := f.redis.flags()
	for i := range 2 {
		f.ingests = append(f.ingests, startSoakProc(t, bin, fmt.Sprintf("ingest%d", i),
			append([]string{"ingest", "--metrics-listen", soakAddr(t)}, rf...)...))
	}
	for i := range 3 {
		addr := soakAddr(t)
		f.pods = append(f.pods, startSoakProc(t, bin, fmt.Sprintf("pod%d", i),
			append([]string{"serve", "--listen", addr, "--pod-name", fmt.Sprintf("pod%d", i)}, rf...)...))
		f.podURL = append(f.podURL, "http://"+addr)
		wait.UntilNil(t, addr+" ready", func() error { return getOK("http://" + addr + "/readyz") })
	}
	for i := range soakReplicas {
		addr, events, replay := soakAddr(t), soakAddr(t), soakAddr(t)
		id := fmt.Sprintf("%s-s%d", soakModel, i)
		f.sims = append(f.sims, startSoakProc(t, bin, id,
			"sim-replica", "--model", soakModel, "--listen", addr, "--events", "tcp://"+events, "--replay", "tcp://"+replay))
		f.simURL = append(f.simURL, "http://"+addr)
		wait.UntilNil(t, id+" healthy", func() error { return getOK("http://" + addr + "/health") })
		f.ids = append(f.ids, id)
		px, ev, rp := startFaultProxy(t, addr), startFaultProxy(t, events), startFaultProxy(t, replay)
		f.proxies = append(f.proxies, px)
		f.zproxies = append(f.zproxies, ev, rp)
		f.regs = append(f.regs, fmt.Sprintf(`{"model":%q,"url":%q,"events":%q,"replay":%q}`,
			soakModel, "http://"+px.addr(), "tcp://"+ev.addr(), "tcp://"+rp.addr()))
		f.register(t, i)
	}
	rc := f.redis.client(t)
	pods := make([]*loadPod, len(f.podURL))
	for i, u := range f.podURL {
		pods[i] = &loadPod{base: u}
	}
	f.live = &liveFleet{model: soakModel, rc: rc, pods: pods, reps: f.ids, client: http.DefaultClient}
	f.live.waitFollowed(t)
	return f
}

// register PUTs replica i through pod 0.
func (f *soakFleet) register(t *testing.T, i int) {
	t.Helper()
	if code, raw := liveDo(t, http.DefaultClient, http.MethodPut, f.podURL[0]+"/v1/replicas/"+f.ids[i], f.regs[i], nil); code/100 != 2 {
		t.Fatalf("PUT /v1/replicas/%s: got %d %s, want 2xx", f.ids[i], code, raw)
	}
}

// chaos runs the seeded fault schedule for dur: after each fault has
// recovered, soakBetween more requests end before the next. It returns
// when the last fault's recovery ended.
func (f *soakFleet) chaos(t *testing.T, r *rand.Rand, dur time.Duration) time.Time {
	t.Helper()
	begin := time.Now()
	end := begin.Add(dur)
	last := begin
	for time.Now().Before(end) {
		n := f.ended.Load()
		wait.Until(t, "requests ending between faults", func() bool { return f.ended.Load() >= n+soakBetween })
		f.nth.Add(1)
		kind := f.fault(t, r)
		if strings.Contains(kind, "restart-empty") {
			f.lostAt.Store(f.nth.Load())
		}
		f.mu.Lock()
		f.faults[kind]++
		f.mu.Unlock()
		last = time.Now()
		t.Logf("fault %s recovered at +%v", kind, last.Sub(begin).Round(time.Millisecond))
	}
	return last
}

// soakFaultKinds is every fault the schedule draws from, with the
// Redis's own (soakRedis.kinds); KVROUTE_SOAK_FAULTS (a comma list)
// narrows it.
var soakFaultKinds = []string{"ingest-sigkill", "pod-sigkill", "link-fault", "sim-restart"}

// fault injects one fault drawn from r among f.kinds and waits for its
// recovery; it returns the fault's name.
func (f *soakFleet) fault(t *testing.T, r *rand.Rand) string {
	t.Helper()
	k := f.kinds[r.IntN(len(f.kinds))]
	if slices.Contains(f.redis.kinds(), k) {
		n := f.holdFor(r)
		f.redis.inject(t, r, k, func(what string) { f.hold(t, what, n) })
		return k
	}
	switch k {
	case "ingest-sigkill":
		i := r.IntN(len(f.ingests))
		f.ingests[i].kill9()
		f.ingests[i].start()
		f.ingests[i].down.Store(false)
		return k
	case "pod-sigkill":
		i := r.IntN(len(f.pods))
		f.pods[i].kill9()
		f.podStart[i].Store(f.nth.Load())
		f.pods[i].restart(f.podURL[i] + "/readyz")
		return k
	case "link-fault":
		return f.linkFault(t, r)
	case "sim-restart":
		i := r.IntN(len(f.sims))
		f.cuts.Add(1)
		f.sims[i].kill9()
		f.sims[i].restart(f.simURL[i] + "/health")
		return k
	}
	t.Fatalf("KVROUTE_SOAK_FAULTS: unknown fault in %v, want some of %v", f.kinds, append(slices.Clone(soakFaultKinds), f.redis.kinds()...))
	return ""
}

// holdFor draws how many requests a fault lasts: it is held while the
// traffic meets it, not for a time, so a slow machine meets it as often.
func (f *soakFleet) holdFor(r *rand.Rand) int64 { return int64(5 + r.IntN(20)) }

// hold waits until n more requests have ended under the fault.
func (f *soakFleet) hold(t *testing.T, what string, n int64) {
	t.Helper()
	from := f.ended.Load()
	wait.Until(t, fmt.Sprintf("%d requests ended under %s", n, what), func() bool { return f.ended.Load() >= from+n })
}

// linkFault degrades one link through its proxy while hold more requests
// end: a pod→replica HTTP link, or an ingestor→replica ZeroMQ link (events
// or replay); latency on new connections, or every connection reset.
func (f *soakFleet) linkFault(t *testing.T, r *rand.Rand) string {
	px, link := f.proxies[r.IntN(len(f.proxies))], "link"
	if r.IntN(2) == 0 {
		// An ingestor's events or replay link: batches published
		// while it is down are lost to the SUB, a gap to replay.
		px, link = f.zproxies[r.IntN(len(f.zproxies))], "zmq-link"
	}
	hold := f.holdFor(r)
	kind := link + "-latency"
	if r.IntN(2) == 0 {
		kind = link + "-reset"
		if link == "link" {
			f.cuts.Add(1)
		}
		px.reset.Store(true)
		px.resetAll()
	} else {
		px.delay.Store(int64(time.Duration(100+r.IntN(900)) * time.Millisecond))
	}
	f.hold(t, kind, hold)
	px.reset.Store(false)
	px.delay.Store(0)
	return kind
}

// waitConverged waits until, for every replica, the blocks the index
// holds (GET /v1/replicas/{id}) equal the blocks its cache holds (GET
// /debug/blocks on the sim-replica), and the index has applied the
// replica's last event batch, no more and no fewer (a batch skipped, or
// a history the index kept from before a restart, would differ), and
// returns when.
func (f *soakFleet) waitConverged(t *testing.T) time.Time {
	t.Helper()
	var agreed []string
	bounded := soakBoundedTB{TB: t, deadline: time.Now().Add(soakConverge)}
	wait.UntilNil(bounded, "the index to agree with every replica", func() error {
		var diff []string
		agreed = agreed[:0]
		for i, id := range f.ids {
			var idx struct {
				Blocks int    `json:"blocks"`
				Seq    *int64 `json:"applied_seq"`
			}
			var sim struct {
				Blocks int   `json:"blocks"`
				Next   int64 `json:"next_seq"`
			}
			if err := getJSON(f.podURL[0]+"/v1/replicas/"+id, &idx); err != nil {
				return err
			}
			if err := getJSON(f.simURL[i]+"/debug/blocks", &sim); err != nil {
				return err
			}
			applied := int64(-1)
			if idx.Seq != nil {
				applied = *idx.Seq
			}
			agreed = append(agreed, fmt.Sprintf("%s %d (seq %d)", id, sim.Blocks, applied))
			if idx.Blocks != sim.Blocks || applied != sim.Next-1 {
				diff = append(diff, fmt.Sprintf("%s: index %d blocks at seq %d, replica %d blocks, last seq %d", id, idx.Blocks, applied, sim.Blocks, sim.Next-1))
			}
		}
		if len(diff) > 0 {
			return errors.New(strings.Join(diff, "; "))
		}
		return nil
	})
	t.Logf("blocks held per replica, index = cache: %s", strings.Join(agreed, ", "))
	return time.Now()
}

// client sends requests until stop: a mix of released decisions,
// completions (streamed or not, some abandoned after the headers) and
// chat completions, over prompts that share a few prefixes.
func (f *soakFleet) client(t *testing.T, r *rand.Rand, stop <-chan struct{}) {
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	for !stopped(stop) {
		pod := r.IntN(len(f.pods))
		if f.pods[pod].down.Load() {
			pod = (pod + 1) % len(f.pods)
		}
		kind, path, body := soakRequest(r)
		gen, cuts := f.pods[pod].gen.Load(), f.cuts.Load()
		start := time.Now()
		status, err := f.send(hc, f.podURL[pod]+path, body, kind == "abandon")
		took := time.Since(start)
		podKilled := f.pods[pod].gen.Load() != gen || f.pods[pod].down.Load()
		f.record(kind, status, err, took, podKilled, f.cuts.Load() != cuts, f.unseeded(pod))
	}
}

// soakRequest draws one request: its kind, path and body.
func soakRequest(r *rand.Rand) (kind, path, body string) {
	prefix := seqTokens(1000+r.IntN(6)*500, 64+16*r.IntN(8))
	p := append(prefix, seqTokens(50_000+r.IntN(40_000), 8+r.IntN(24))...)
	m := map[string]any{"model": soakModel, "max_tokens": 1 + r.IntN(8)}
	switch k := r.IntN(10); {
	case k < 3:
		m["token_ids"] = p
		kind, path = "route", "/v1/route"
	case k < 5:
		m["prompt"] = p
		kind, path = "completion", "/v1/completions"
	case k < 7:
		m["prompt"], m["stream"] = p, true
		kind, path = "stream", "/v1/completions"
	case k < 8:
		m["prompt"], m["stream"], m["max_tokens"] = p, true, 64
		kind, path = "abandon", "/v1/completions"
	default:
		m["messages"] = []map[string]string{{"role": "user", "content": fmt.Sprintf("chat prefix %d, then question %d", r.IntN(4), r.IntN(1000))}}
		kind, path = "chat", "/v1/chat/completions"
	}
	raw, _ := json.Marshal(m)
	return kind, path, string(raw)
}

// send posts body to url within soakDeadline; a decision is released,
// and abandon leaves once the headers came.
func (f *soakFleet) send(hc *http.Client, url, body string, abandon bool) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), soakDeadline)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := hc.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if abandon {
		cancel()
		return resp.StatusCode, nil
	}
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return resp.StatusCode, err
	}
	if strings.HasSuffix(url, "/v1/route") && resp.StatusCode == http.StatusOK {
		var d struct {
			RequestID string `json:"request_id"`
		}
		if err := json.Unmarshal(raw, &d); err != nil {
			return resp.StatusCode, err
		}
		rel := strings.TrimSuffix(url, "/v1/route") + "/v1/requests/" + d.RequestID + "/release"
		rresp, err := hc.Post(rel, "application/json", nil)
		if err != nil {
			return resp.StatusCode, fmt.Errorf("release: %w", err)
		}
		rresp.Body.Close()
	}
	return resp.StatusCode, nil
}

// unseeded reports whether pod was started within two faults of the last
// one that emptied a Redis: it then may have met the registry empty before
// any pod that had a copy re-seeded it, and has no copy of its own: a
// model missing from it is not found (404), which is what it can know.
func (f *soakFleet) unseeded(pod int) bool {
	lost, started := f.lostAt.Load(), f.podStart[pod].Load()
	return lost > 0 && started > 0 && started >= lost-2 && started <= lost+2
}

// record files one ended request; podKilled says its pod was killed
// while it ran, which excuses a transport error; cut says a replica
// fault happened while it ran, which excuses a 200 cut mid-body (its
// status was sent before the replica failed); unseeded excuses a 404
// from a pod started as a Redis lost the registry (see unseeded).
func (f *soakFleet) record(kind string, status int, err error, took time.Duration, podKilled, cut, unseeded bool) {
	f.ended.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	switch {
	case err == nil && status == http.StatusNotFound && unseeded:
		f.outcome["404 from a pod started as the registry was lost"]++
	case err != nil && podKilled:
		f.outcome["cut by pod kill"]++
	case err != nil && cut && status == http.StatusOK:
		f.outcome["200 cut mid-body by replica fault"]++
	case err != nil:
		f.outcome["error"]++
		f.bad = append(f.bad, fmt.Sprintf("%s: status %d after %v: %v", kind, status, took, err))
	case !slices.Contains(soakStatuses, status):
		f.outcome[strconv.Itoa(status)]++
		f.bad = append(f.bad, fmt.Sprintf("%s: status %d after %v", kind, status, took))
	default:
		f.outcome[strconv.Itoa(status)]++
	}
}
