package infra_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"sigs.k8s.io/yaml"

	"github.com/kvroute/kvroute/internal/wait"
)

// TestPrometheusStoreDownAlert runs the alerts for real: a real
// prometheus (Debian's binary) on loopback scraping `kvroute serve` every
// second and evaluating kvroute-rules.yaml, over a redis-server this test
// stops and starts. KvrouteStoreDown must fire during the outage and be
// gone after it. The rule file is loaded as a templated copy with the
// store-down alert's for: (2m) and range ([1m]) shortened to 1s and 3s;
// everything else as shipped. A probe of /readyz every 200 ms stands in
// for the kubelet's readiness probe: it is what makes an idle pod call
// its store, and so what kvroute_store_up reports on.
func TestPrometheusStoreDownAlert(t *testing.T) {
	promBin := lookTool(t, "prometheus")
	lookTool(t, "redis-server")
	kvrouteBinary(t) // built before the processes start
	rp := startRedisProc(t)
	addr := freeAddr(t)
	base := "http://" + addr
	serve := startProc(t, "serve", "--listen", addr, "--redis-url", rp.url(), "--log-format", "json")
	waitHTTP(t, serve, base+"/readyz", 30*time.Second)
	probeReadiness(t, base+"/readyz", 200*time.Millisecond)
	prom := startPrometheus(t, promBin, addr, shortenedRules(t))

	wait.UntilNil(t, "Prometheus to scrape kvroute_store_up 1 and evaluate the store-down rule", func() error {
		if v, err := prom.scalar(`kvroute_store_up{job="kvroute"}`); err != nil || v != 1 {
			return fmt.Errorf("kvroute_store_up: %v, %v", v, err)
		}
		st, err := prom.ruleState("KvrouteStoreDown")
		if err != nil {
			return err
		}
		if st != "inactive" {
			return fmt.Errorf("KvrouteStoreDown is %s with Redis up, want inactive", st)
		}
		return nil
	})
	t.Run("every rule and panel expression is valid PromQL", func(t *testing.T) {
		exprs := dashboardExprs(t)
		for _, r := range readRules(t).alerts() {
			exprs = append(exprs, r.Expr)
		}
		for _, e := range exprs {
			// Grafana's variables, as Grafana would substitute them.
			q := strings.NewReplacer("$__rate_interval", "1m", "$ingest_job", ".*", "$job", ".*").Replace(e)
			if _, err := prom.query(q); err != nil {
				t.Errorf("%s: %v", e, err)
			}
		}
	})

	rp.stop()
	outage := time.Now()
	wait.UntilNil(t, "KvrouteStoreDown firing while Redis is down", func() error {
		a, err := prom.alert("KvrouteStoreDown")
		if err != nil {
			return err
		}
		if a == nil || a.State != "firing" {
			return fmt.Errorf("alert: %+v", a)
		}
		if got, want := a.Labels["severity"], "critical"; got != want {
			t.Errorf("severity: got %q, want %q", got, want)
		}
		if got, want := a.Labels["instance"], addr; got != want {
			t.Errorf("instance: got %q, want %q", got, want)
		}
		return nil
	})
	t.Logf("KvrouteStoreDown fired %v after Redis stopped", time.Since(outage).Round(time.Millisecond))
	// Both of the alert's causes were there: the gauge read 0, and the
	// failed commands were counted.
	if v, err := prom.scalar(`min(min_over_time(kvroute_store_up{job="kvroute"}[1m]))`); err != nil || v != 0 {
		t.Errorf("kvroute_store_up's minimum during the outage: %v, %v; want 0", v, err)
	}
	if v, err := prom.scalar(`sum(increase(kvroute_redis_errors_total{job="kvroute"}[1m]))`); err != nil || v <= 0 {
		t.Errorf("Redis errors counted during the outage: %v, %v; want some", v, err)
	}

	rp.start()
	back := time.Now()
	wait.UntilNil(t, "KvrouteStoreDown gone once Redis is back", func() error {
		a, err := prom.alert("KvrouteStoreDown")
		if err != nil {
			return err
		}
		if a != nil {
			return fmt.Errorf("still %s", a.State)
		}
		return nil
	})
	t.Logf("KvrouteStoreDown resolved %v after Redis started again", time.Since(back).Round(time.Millisecond))
	if v, err := prom.scalar(`kvroute_store_up{job="kvroute"}`); err != nil || v != 1 {
		t.Errorf("kvroute_store_up after the outage: %v, %v; want 1", v, err)
	}
}

// shortenedRules writes kvroute-rules.yaml with KvrouteStoreDown's for:
// and range shortened for a test that runs in seconds, and returns the
// copy's path.
func shortenedRules(tb testing.TB) string {
	tb.Helper()
	rules := readRules(tb)
	found := false
	for gi := range rules.Groups {
		for ri := range rules.Groups[gi].Rules {
			r := &rules.Groups[gi].Rules[ri]
			if r.Alert != "KvrouteStoreDown" {
				continue
			}
			if !strings.Contains(r.Expr, "[1m]") {
				tb.Fatalf("KvrouteStoreDown's expression has no [1m] range to shorten: %s", r.Expr)
			}
			r.Expr, r.For, found = strings.ReplaceAll(r.Expr, "[1m]", "[3s]"), "1s", true
		}
	}
	if !found {
		tb.Fatal("no KvrouteStoreDown alert in the rule file")
	}
	b, err := yaml.Marshal(rules)
	if err != nil {
		tb.Fatal(err)
	}
	path := filepath.Join(tb.TempDir(), "kvroute-rules.yaml")
	if err := os.WriteFile(path, b, 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

// probeReadiness gets url every interval until the test ends, as a
// kubelet's readiness probe would; its answers are not checked.
func probeReadiness(tb testing.TB, url string, interval time.Duration) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(interval)
		defer tick.Stop()
		for {
			_, _, _ = call(ctx, http.MethodGet, url, "")
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	tb.Cleanup(func() { cancel(); <-done })
}

// promServer is a prometheus process a test started, and its HTTP API.
type promServer struct {
	base string
	proc *proc
}

// startPrometheus runs prometheus on a free loopback port with a temporary
// data directory, scraping target (job "kvroute") and evaluating rules
// every second, and waits until it is ready. It is stopped (SIGTERM) when
// the test ends, and its log shown if the test failed.
func startPrometheus(tb testing.TB, bin, target, rules string) *promServer {
	tb.Helper()
	dir := tb.TempDir()
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  scrape_timeout: 1s
  evaluation_interval: 1s
rule_files:
  - %q
scrape_configs:
  - job_name: kvroute
    static_configs:
      - targets: [%q]
`, rules, target)
	cfgPath := filepath.Join(dir, "prometheus.yml")
	if err := os.WriteFile(cfgPath, []byte(cfg), 0o600); err != nil {
		tb.Fatal(err)
	}
	addr := freeAddr(tb)
	p := &proc{cmd: exec.Command(bin, "--config.file="+cfgPath, "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr, "--log.level=warn"), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		tb.Fatalf("prometheus: %v", err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	tb.Cleanup(func() {
		p.stop()
		if tb.Failed() {
			tb.Logf("prometheus logs:\n%s", p.logs())
		}
	})
	s := &promServer{base: "http://" + addr, proc: p}
	wait.UntilNil(tb, "prometheus ready", func() error {
		select {
		case <-p.done:
			tb.Fatalf("prometheus exited:\n%s", p.logs())
		default:
		}
		code, body, err := call(context.Background(), http.MethodGet, s.base+"/-/ready", "")
		if err == nil && code != http.StatusOK {
			err = fmt.Errorf("/-/ready: %d %s", code, body)
		}
		return err
	})
	tb.Logf("real prometheus at %s (%s)", addr, bin)
	return s
}

// api gets one of Prometheus's /api/v1 endpoints and decodes its data.
func (s *promServer) api(path string, data any) error {
	code, body, err := call(context.Background(), http.MethodGet, s.base+"/api/v1/"+path, "")
	if err != nil {
		return err
	}
	var env struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return fmt.Errorf("%s: %d %s", path, code, body)
	}
	if env.Status != "success" {
		return fmt.Errorf("%s: %d %s", path, code, env.Error)
	}
	return json.Unmarshal(env.Data, data)
}

// query runs an instant query and returns its result's samples.
func (s *promServer) query(q string) ([]promSample, error) {
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := s.api("query?query="+url.QueryEscape(q), &d); err != nil {
		return nil, err
	}
	if d.ResultType != "vector" {
		return nil, nil // a scalar or string: valid, nothing to read
	}
	var out []promSample
	return out, json.Unmarshal(d.Result, &out)
}

type promSample struct {
	Metric map[string]string `json:"metric"`
	Value  [2]any            `json:"value"`
}

// scalar is the value of a query that returns one sample.
func (s *promServer) scalar(q string) (float64, error) {
	res, err := s.query(q)
	if err != nil {
		return 0, err
	}
	if len(res) != 1 {
		return 0, fmt.Errorf("%s: %d samples, want 1", q, len(res))
	}
	v, _ := res[0].Value[1].(string)
	return strconv.ParseFloat(v, 64)
}

type promAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// alert is the active (pending or firing) alert named name, or nil.
func (s *promServer) alert(name string) (*promAlert, error) {
	var d struct {
		Alerts []promAlert `json:"alerts"`
	}
	if err := s.api("alerts", &d); err != nil {
		return nil, err
	}
	for _, a := range d.Alerts {
		if a.Labels["alertname"] == name {
			return &a, nil
		}
	}
	return nil, nil
}

// ruleState is the alerting rule's state once it has been evaluated
// without error (inactive, pending, firing).
func (s *promServer) ruleState(name string) (string, error) {
	var d struct {
		Groups []struct {
			Rules []struct {
				Name           string    `json:"name"`
				State          string    `json:"state"`
				Health         string    `json:"health"`
				LastError      string    `json:"lastError"`
				LastEvaluation time.Time `json:"lastEvaluation"`
			} `json:"rules"`
		} `json:"groups"`
	}
	if err := s.api("rules?type=alert", &d); err != nil {
		return "", err
	}
	for _, g := range d.Groups {
		for _, r := range g.Rules {
			if r.Name != name {
				continue
			}
			if r.Health != "ok" || r.LastEvaluation.IsZero() {
				return "", fmt.Errorf("rule %s: health %q (%s), last evaluated %v", name, r.Health, r.LastError, r.LastEvaluation)
			}
			return r.State, nil
		}
	}
	return "", fmt.Errorf("no rule %s loaded", name)
}

// redisProc is a redis-server this test controls: stopped and started
// again on the same port (empty: no persistence), as an outage would.
type redisProc struct {
	tb   testing.TB
	port int
	dir  string
	cmd  *exec.Cmd
	done chan struct{}
}

func startRedisProc(tb testing.TB) *redisProc {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	p := &redisProc{tb: tb, port: ln.Addr().(*net.TCPAddr).Port, dir: tb.TempDir()}
	ln.Close()
	p.start()
	tb.Cleanup(p.stop)
	return p
}

func (p *redisProc) url() string { return "redis://127.0.0.1:" + strconv.Itoa(p.port) }

// start runs redis-server on the port and waits until it answers.
func (p *redisProc) start() {
	p.tb.Helper()
	p.cmd = exec.Command("redis-server", "--port", strconv.Itoa(p.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", p.dir)
	if err := p.cmd.Start(); err != nil {
		p.tb.Fatalf("redis-server: %v", err)
	}
	p.done = make(chan struct{})
	go func(cmd *exec.Cmd, done chan struct{}) { _ = cmd.Wait(); close(done) }(p.cmd, p.done)
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(p.port)})
	defer c.Close()
	wait.UntilNil(p.tb, "redis-server to answer", func() error {
		select {
		case <-p.done:
			p.tb.Fatalf("redis-server on port %d exited", p.port)
		default:
		}
		return c.Ping(context.Background()).Err()
	})
	p.tb.Logf("real redis-server (controlled) at 127.0.0.1:%d, pid %d", p.port, p.cmd.Process.Pid)
}

// stop kills the server (SIGKILL: a crash) and waits for it to exit.
func (p *redisProc) stop() {
	if p.cmd == nil {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
	p.cmd = nil
}
