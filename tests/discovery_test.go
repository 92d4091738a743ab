package tests_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/dnstest"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/store"
	"github.com/kvroute/kvroute/vllmtest"
)

// discoverInterval is the fleet tests' --discover-interval: the DNS name
// is re-resolved this often, which bounds how late the registry learns of
// a change.
const discoverInterval = 500 * time.Millisecond

// fleet is three `kvroute sim-replica` processes on 127.0.0.2, .3 and .4
// sharing their ports (every 127/8 address reaches lo on Linux, so one A
// record per replica suffices), a dnsmasq naming them, Redis, `kvroute
// ingest` discovering them and `kvroute serve` deciding over them.
type fleet struct {
	t     *testing.T
	ctx   context.Context
	dns   *dnstest.Server
	st    *store.Store
	serve *process
	name  string
	ips   []string
	port  int
	rng   *rand.Rand
}

func newFleet(t *testing.T, grace time.Duration) *fleet {
	t.Helper()
	ctx := context.Background()
	f := &fleet{t: t, ctx: ctx, name: "vllm." + dnstest.Domain, ips: []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"},
		rng: rand.New(rand.NewPCG(21, 21))}
	f.dns = dnstest.Start(t, nil)
	redisURL := redistest.Server(t)
	st, err := store.Open(ctx, redisURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	f.st = st

	ports := sharedPorts(t, f.ips, 3)
	f.port = ports[0]
	for _, ip := range f.ips {
		startProcess(t, "sim-replica", "--model", "demo", "--listen", net.JoinHostPort(ip, strconv.Itoa(ports[0])),
			"--events", "tcp://"+net.JoinHostPort(ip, strconv.Itoa(ports[1])), "--replay", "tcp://"+net.JoinHostPort(ip, strconv.Itoa(ports[2])),
			"--decode-tokens-per-sec", "0", "--prefill-tokens-per-sec", "0")
	}
	for _, ip := range f.ips {
		url := "http://" + net.JoinHostPort(ip, strconv.Itoa(ports[0])) + "/health"
		wait.UntilNil(t, "sim-replica "+ip+" answers /health", func() error { return getOK(url) })
	}
	startProcess(t, "ingest", "--redis-url", redisURL, "--metrics-listen", "127.0.0.1:0", "--owner", "ingest-a",
		"--discover-dns", f.name, "--discover-dns-server", f.dns.Addr, "--discover-interval", discoverInterval.String(),
		"--discover-http-port", strconv.Itoa(ports[0]), "--discover-events-port", strconv.Itoa(ports[1]),
		"--discover-replay-port", strconv.Itoa(ports[2]), "--discover-grace", grace.String(),
		"--health-interval", "500ms", "--metrics-interval", "500ms")
	f.serve = startServe(t, "--redis-url", redisURL)
	return f
}

// id is the replica id discovery derives for ip.
func (f *fleet) id(ip string) string { return ip + "-" + strconv.Itoa(f.port) }

// publish makes DNS answer exactly ips for the fleet's name; it returns
// once dnsmasq does.
func (f *fleet) publish(ips []string) {
	f.t.Helper()
	hosts := map[string][]string{}
	if len(ips) > 0 {
		hosts[f.name] = ips
	}
	f.dns.SetHosts(f.t, hosts)
}

// matches reports whether the registry is the truth: every ip in DNS a
// serving replica of model demo, discovered by the name's source; every
// other one gone or purged.
func (f *fleet) matches(inDNS []string) error {
	reps, err := f.st.ListReplicas(f.ctx)
	if err != nil {
		return err
	}
	byID := map[string]kvroute.Replica{}
	for _, r := range reps {
		byID[r.ID] = r
	}
	for _, ip := range f.ips {
		r, ok := byID[f.id(ip)]
		switch in := slices.Contains(inDNS, ip); {
		case in && (!ok || r.State != kvroute.StateServing || r.Model != "demo" || r.Source != "dns:"+f.name):
			return fmt.Errorf("%s is in DNS; registry has %+v (present %v)", ip, r, ok)
		case !in && ok && r.State != kvroute.StateGone:
			return fmt.Errorf("%s left DNS; registry has it %s", ip, r.State)
		}
	}
	return nil
}

// decide asks serve for a decision on a fresh prompt and returns it; its
// booking is held until release, so that the next decisions spread.
func (f *fleet) decide() decision {
	f.t.Helper()
	toks := make([]int, 64)
	for i := range toks {
		toks[i] = 1 + f.rng.IntN(30000)
	}
	b, _ := json.Marshal(map[string]any{"model": "demo", "token_ids": toks})
	code, _, body := f.serve.post(f.t, "/v1/route", string(b))
	if code != http.StatusOK {
		f.t.Fatalf("route: %d %s", code, body)
	}
	var d decision
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		f.t.Fatalf("route: %v: %s", err, body)
	}
	return d
}

func (f *fleet) release(ds []decision) {
	f.t.Helper()
	for _, d := range ds {
		if code, _, body := f.serve.post(f.t, "/v1/requests/"+d.RequestID+"/release", ""); code != http.StatusOK {
			f.t.Fatalf("release %s: %d %s", d.RequestID, code, body)
		}
	}
}

// untilNamed decides until a decision names id and returns how long after
// since that was.
func (f *fleet) untilNamed(id string, since time.Time) time.Duration {
	f.t.Helper()
	var held []decision
	defer func() { f.release(held) }()
	for {
		d := f.decide()
		held = append(held, d)
		if d.Replica.ID == id {
			return time.Since(since)
		}
		if len(held) > 2000 {
			f.t.Fatalf("2000 decisions and none named %s", id)
		}
	}
}

// untilExcluded decides until the registry has id gone and the last
// quiet decisions in a row, made after that, did not name it (with every
// booking held, a routable replica with the least load would be named
// within a few); it returns how long after since the last decision naming
// id was made (0: none after since), and when the registry was first seen
// with it gone.
func (f *fleet) untilExcluded(id string, since time.Time) (last, goneAfter time.Duration) {
	f.t.Helper()
	const quiet = 30
	var held []decision
	defer func() { f.release(held) }()
	gone, streak := false, 0
	for streak < quiet {
		d := f.decide()
		held = append(held, d)
		if d.Replica.ID == id {
			last, streak = time.Since(since), 0
			if gone && len(held) > 2000 {
				f.t.Fatalf("%s still named by decisions long after its registry entry was gone", id)
			}
			continue
		}
		if !gone {
			r, err := f.st.GetReplica(f.ctx, id)
			gone = err != nil || r.State == kvroute.StateGone
			goneAfter = time.Since(since)
		}
		if gone {
			streak++
		}
	}
	return last, goneAfter
}

// noBookings checks that every replica's load is zero and no lease is
// left: every decision was released.
func (f *fleet) noBookings() {
	f.t.Helper()
	ids := make([]string, len(f.ips))
	for i, ip := range f.ips {
		ids[i] = f.id(ip)
	}
	loads, err := f.st.Loads(f.ctx, "demo", ids)
	if err != nil {
		f.t.Fatal(err)
	}
	for i, l := range loads {
		if l.PrefillBlocks != 0 || l.DecodeBlocks != 0 || l.Requests != 0 {
			f.t.Errorf("%s: load %+v after every booking was released; want zero", ids[i], l)
		}
	}
	if n, err := f.st.SweepExpired(f.ctx, "demo"); err != nil || n != 0 {
		f.t.Errorf("sweep: %d leases left (%v); want none", n, err)
	}
}

// TestDNSDiscovery: three replicas appear in DNS one by one and are
// routed to, their model learned from /v1/models; one leaves DNS and no
// decision names it once the registry has it gone.
func TestDNSDiscovery(t *testing.T) {
	f := newFleet(t, 30*time.Second)
	var in []string
	for _, ip := range f.ips {
		in = append(in, ip)
		f.publish(in)
		at := time.Now()
		wait.UntilNil(t, ip+" registered", func() error { return f.matches(in) })
		registered := time.Since(at)
		routed := f.untilNamed(f.id(ip), at)
		t.Logf("%s: registered %v, first decision naming it %v after it appeared in DNS", ip, registered.Round(time.Millisecond), routed.Round(time.Millisecond))
	}
	f.publish(in[:2])
	at := time.Now()
	last, gone := f.untilExcluded(f.id(in[2]), at)
	if err := f.matches(in[:2]); err != nil {
		t.Fatal(err)
	}
	t.Logf("%s: gone in the registry %v, last decision naming it %v after it left DNS", in[2], gone.Round(time.Millisecond), last.Round(time.Millisecond))
	f.noBookings()
}

// TestDNSDiscoveryCycles: 20 add/remove cycles; after each change the
// registry matches DNS within one resolution interval (and the time to a
// model lookup), and no booking leaks. The last cycle leaves a replica
// gone past its grace: it is purged, and comes back as a new replica.
func TestDNSDiscoveryCycles(t *testing.T) {
	if testing.Short() {
		t.Skip("20 discovery cycles")
	}
	const grace = 3 * time.Second
	f := newFleet(t, grace)
	all := slices.Clone(f.ips)
	f.publish(all)
	wait.UntilNil(t, "three replicas registered", func() error { return f.matches(all) })

	var reg, appear, leave []time.Duration
	for i := range 20 {
		ip := f.ips[i%3]
		in := slices.DeleteFunc(slices.Clone(all), func(s string) bool { return s == ip })
		f.publish(in)
		// Decisions flow while the change propagates, so that the last
		// one naming the replica is measured, not a quiet interval.
		last, gone := f.untilExcluded(f.id(ip), time.Now())
		if err := f.matches(in); err != nil {
			t.Fatalf("cycle %d: %v", i, err)
		}
		reg, leave = append(reg, gone), append(leave, last)
		if i == 19 {
			wait.Until(t, ip+" purged after the grace", func() bool {
				_, err := f.st.GetReplica(f.ctx, f.id(ip))
				return err != nil
			})
		}
		f.publish(all)
		at := time.Now()
		wait.UntilNil(t, fmt.Sprintf("cycle %d: %s back", i, ip), func() error { return f.matches(all) })
		reg = append(reg, time.Since(at))
		appear = append(appear, f.untilNamed(f.id(ip), at))
	}
	f.noBookings()
	slices.Sort(reg)
	if worst, bound := reg[len(reg)-1], discoverInterval+time.Second; worst > bound {
		t.Errorf("the registry matched DNS at worst %v after a change; want within one interval (%v) and a lookup", worst, discoverInterval)
	}
	t.Logf("registry matches DNS after a change: %s", quantiles(reg))
	t.Logf("appear in DNS -> first decision naming it: %s", quantiles(appear))
	t.Logf("leave DNS -> last decision naming it: %s", quantiles(leave))
}

func quantiles(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))].Round(time.Millisecond) }
	return fmt.Sprintf("n=%d min %v p50 %v p90 %v max %v", len(s), s[0].Round(time.Millisecond), q(0.5), q(0.9), s[len(s)-1].Round(time.Millisecond))
}

// sharedPorts picks n ports free on every one of ips.
func sharedPorts(t *testing.T, ips []string, n int) []int {
	t.Helper()
	var out []int
	for len(out) < n {
		l, err := net.Listen("tcp", net.JoinHostPort(ips[0], "0"))
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		free := true
		var ls []net.Listener
		for _, ip := range ips[1:] {
			l2, err := net.Listen("tcp", net.JoinHostPort(ip, strconv.Itoa(port)))
			if err != nil {
				free = false
				break
			}
			ls = append(ls, l2)
		}
		for _, l2 := range ls {
			_ = l2.Close()
		}
		_ = l.Close()
		if free && !slices.Contains(out, port) {
			out = append(out, port)
		}
	}
	return out
}

func getOK(url string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	_, _ = io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s", url, resp.Status)
	}
	return nil
}

// startProcess runs `kvroute <args>` until the test ends (SIGTERM, then
// its logs if the test failed).
func startProcess(t *testing.T, args ...string) {
	t.Helper()
	cmd := exec.Command(kvrouteBinary(t), append(args, "--log-format", "json")...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var logs []string
	done := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 0, 64<<10), 1<<20)
		for sc.Scan() {
			mu.Lock()
			logs = append(logs, sc.Text())
			mu.Unlock()
		}
		_ = cmd.Wait()
		close(done)
	}()
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			mu.Lock()
			t.Logf("kvroute %s logs:\n%s", args[0], strings.Join(logs, "\n"))
			mu.Unlock()
		}
	})
}

// TestDNSDiscoverySRV: a name's SRV records give each replica its own
// host and HTTP port (three replicas on one address, distinct ports); the
// replicas publish no events here (--discover-events-port 0), so they are
// routed on approximate entries.
func TestDNSDiscoverySRV(t *testing.T) {
	srvName := "_http._tcp.vllm." + dnstest.Domain
	var recs []dnstest.SRV
	hosts := map[string][]string{}
	want := map[string]string{}
	for i := range 3 {
		r, err := vllmtest.New(vllmtest.Config{Model: "demo"})
		if err != nil {
			t.Fatal(err)
		}
		if err := r.Start(context.Background()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = r.Stop() })
		_, port, _ := net.SplitHostPort(strings.TrimPrefix(r.URL(), "http://"))
		p, _ := strconv.Atoi(port)
		target := fmt.Sprintf("r%d.%s", i, dnstest.Domain)
		recs = append(recs, dnstest.SRV{Name: srvName, Target: target, Port: p})
		hosts[target] = []string{"127.0.0.1"}
		want["127.0.0.1-"+port] = "http://127.0.0.1:" + port
	}
	dns := dnstest.Start(t, hosts, recs...)
	redisURL := redistest.Server(t)
	st, err := store.Open(context.Background(), redisURL, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	startProcess(t, "ingest", "--redis-url", redisURL, "--metrics-listen", "127.0.0.1:0",
		"--discover-dns", srvName, "--discover-dns-server", dns.Addr, "--discover-interval", discoverInterval.String(),
		"--discover-events-port", "0", "--discover-replay-port", "0")
	wait.UntilNil(t, "three SRV replicas registered", func() error {
		reps, err := st.ListReplicas(context.Background())
		if err != nil {
			return err
		}
		got := map[string]string{}
		for _, r := range reps {
			if r.Model != "demo" || r.Source != "dns:"+srvName || r.Events != "" || r.Replay != "" {
				return fmt.Errorf("%s: %+v", r.ID, r)
			}
			got[r.ID] = r.URL
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			return fmt.Errorf("registry %v, want %v", got, want)
		}
		return nil
	})
	serve := startServe(t, "--redis-url", redisURL)
	f := &fleet{t: t, ctx: context.Background(), st: st, serve: serve, rng: rand.New(rand.NewPCG(3, 3))}
	var held []decision
	named := map[string]bool{}
	for len(named) < 3 && len(held) < 300 {
		d := f.decide()
		held = append(held, d)
		named[d.Replica.ID] = true
	}
	f.release(held)
	if len(named) != 3 {
		t.Errorf("decisions named %v, want all three SRV replicas", named)
	}
}
