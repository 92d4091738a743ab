package tests_test

import (
	"context"
	"flag"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/common/expfmt"
	pmodel "github.com/prometheus/common/model"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/testfiles"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenizer/qwen3"
	"github.com/kvroute/kvroute/vllmtest"
)

var updateMetrics = flag.Bool("update-metrics", false, "rewrite testdata/metrics.golden from this run's /metrics")

// addedSeries are the families that the OpenTelemetry work added to what
// operators scraped before it (true: served after any traffic; false:
// only once Redis fails a command); everything in metrics.golden must stay
// as it was (name, type, help and label names).
var addedSeries = map[string]bool{
	"kvroute_decision_stage_duration_seconds": true,
	// Admission's: every decision admitted at once is counted.
	"kvroute_admitted_total":     true,
	"kvroute_redis_errors_total": false,
}

// lateSeries are families that exist only once their first event has
// happened, which the test's traffic makes some runs and not others: the
// embedded ingestor's first health probe may come after the scrape. When
// served, each must read as given.
var lateSeries = map[string]string{
	// Admission's, served once a request queues or is shed
	// (tests/admission_test.go drives them).
	"kvroute_queue_depth":                `kvroute_queue_depth gauge [model] "Requests queued for a model fleet-wide, as this pod's last beat read it from the store (the same figure as LLEN kvr:{m:<model>}:depth)."`,
	"kvroute_queue_waiting":              `kvroute_queue_waiting gauge [model,priority,tenant] "Queued requests this pod holds, by model, priority and tenant."`,
	"kvroute_queue_wait_seconds":         `kvroute_queue_wait_seconds histogram [model,outcome,priority,tenant] "Time requests waited in the admission queue, by model, priority, tenant and outcome (admitted, shed, gone)."`,
	"kvroute_queue_dispatch_seconds":     `kvroute_queue_dispatch_seconds histogram [model] "Time from capacity freed (the queue's grant) to the queued request's pod told, by model."`,
	"kvroute_queued_total":               `kvroute_queued_total counter [model,priority] "Requests that found no replica with room and queued, by model and priority."`,
	"kvroute_shed_total":                 `kvroute_shed_total counter [model,priority,reason] "Requests admission refused, by model, priority and reason (queue_full, band_full, tenant_full, ttl, no_wait, no_replica, pod_limit; client_gone: the client left while it waited)."`,
	"kvroute_ingest_health_probes_total": `kvroute_ingest_health_probes_total counter [result] "Health probes by result (healthy, unhealthy)."`,
	// Served once a data-parallel replica is found ignoring its pins
	// (TestDataParallelPinIgnored scrapes it).
	"kvroute_data_parallel_pin_ignored_total": `kvroute_data_parallel_pin_ignored_total counter [replica] "Data-parallel replicas this pod found ignoring the X-data-parallel-rank header (pinned responses served none of the cache the pinned engine held), by replica; each is then routed as one replica, fleet-wide."`,
	// Served once a replica misses its header bound or dies mid-answer
	// (tests/proxyfaults_test.go scrapes them).
	"kvroute_proxy_header_timeouts_total": `kvroute_proxy_header_timeouts_total counter [replica] "Proxied request attempts whose replica sent no response headers within the bound (--proxy-header-timeout; for a non-streaming request, plus its predicted duration): the replica is marked suspect and the request fails over, by replica."`,
	"kvroute_proxy_stream_errors_total":   `kvroute_proxy_stream_errors_total counter [replica,sse] "Proxied responses whose replica failed after the headers, before the body ended (sse=true: the client's stream ended with an error event), by replica and sse; the replica is marked suspect."`,
}

// TestMetricNames scrapes a serving pod's /metrics after traffic that
// touches every series (decisions, a cache-blind one, proxied responses,
// a failover, an error) and holds it to testdata/metrics.golden: the
// names, types, help texts and label names operators scrape. It also
// checks every kvroute_ name README.md mentions is served. Run with
// -update-metrics to rewrite the golden on purpose.
func TestMetricNames(t *testing.T) {
	scrape := metricsAfterTraffic(t)
	got := describeFamilies(t, scrape)
	path := filepath.Join("testdata", "metrics.golden")
	if *updateMetrics {
		var b strings.Builder
		for _, name := range sortedKeys(got) {
			if _, late := lateSeries[name]; late {
				continue
			}
			if _, added := addedSeries[name]; !added {
				b.WriteString(got[name] + "\n")
			}
		}
		if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(raw)), "\n") {
		want[strings.Fields(line)[0]] = line
	}
	t.Run("unchanged", func(t *testing.T) {
		for name, w := range want {
			if g, ok := got[name]; !ok {
				t.Errorf("%s is no longer served; want\n\t%s", name, w)
			} else if g != w {
				t.Errorf("%s changed:\n\tgot  %s\n\twant %s", name, g, w)
			}
		}
	})
	t.Run("nothing unexpected", func(t *testing.T) {
		for name, g := range got {
			if w, late := lateSeries[name]; late {
				if g != w {
					t.Errorf("%s changed:\n\tgot  %s\n\twant %s", name, g, w)
				}
				continue
			}
			if _, added := addedSeries[name]; !added && want[name] == "" {
				t.Errorf("new series %s (no otel_scope_info, target_info or renamed series wanted):\n\t%s", name, g)
			}
			if strings.Contains(g, "otel_scope") {
				t.Errorf("%s carries OpenTelemetry scope labels: %s", name, g)
			}
		}
	})
	t.Run("added", func(t *testing.T) {
		for name, always := range addedSeries {
			if _, ok := got[name]; always && !ok {
				t.Errorf("%s is not served", name)
			}
		}
		if g, want := got["kvroute_decision_stage_duration_seconds"], "histogram [stage]"; !strings.Contains(g, want) {
			t.Errorf("stage histogram: got %q, want %q in it", g, want)
		}
		for _, stage := range []string{"tokenize", "registry", "keying", "lookup", "scoring", "reserve"} {
			if !strings.Contains(scrape, fmt.Sprintf(`kvroute_decision_stage_duration_seconds_count{stage=%q}`, stage)) {
				t.Errorf("no %s stage observations", stage)
			}
		}
	})
	t.Run("README", func(t *testing.T) {
		readme, err := os.ReadFile(filepath.Join(testfiles.Root(), "README.md"))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range regexp.MustCompile(`kvroute_[a-z_]+`).FindAllString(string(readme), -1) {
			name = strings.TrimSuffix(name, "_")
			if _, late := lateSeries[name]; late {
				continue // served once its event happens, pinned above then
			}
			if _, ok := got[name]; !ok {
				t.Errorf("README names %s, which /metrics does not serve", name)
			}
		}
	})
}

// fixedSource reports one set of endpoints and no change after.
type fixedSource struct{ eps []discovery.Endpoint }

func (fixedSource) Name() string { return "static:metrics" }
func (s fixedSource) Run(ctx context.Context, update func([]discovery.Endpoint)) error {
	update(s.eps)
	<-ctx.Done()
	return ctx.Err()
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

// describeFamilies parses a Prometheus text scrape into one line per
// family: name, type, label names (sorted, histogram le and summary
// quantile left out) and help.
func describeFamilies(t *testing.T, scrape string) map[string]string {
	t.Helper()
	parser := expfmt.NewTextParser(pmodel.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(strings.NewReader(scrape))
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	out := map[string]string{}
	for name, f := range fams {
		labels := map[string]bool{}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = true
			}
		}
		names := make([]string, 0, len(labels))
		for l := range labels {
			names = append(names, l)
		}
		slices.Sort(names)
		out[name] = fmt.Sprintf("%s %s [%s] %q", name, strings.ToLower(f.GetType().String()), strings.Join(names, ","), f.GetHelp())
	}
	return out
}

// metricsAfterTraffic runs a pod (with its ingestor in process, so that
// its series are on the same /metrics) over a real Redis and a simulated
// replica, sends traffic touching every series, and returns the scrape.
// Two api series are left out: kvroute_cache_phantom_total and
// kvroute_cache_unreported_total need a replica that misreports, and
// api's own tests cover them.
func metricsAfterTraffic(t *testing.T) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	rc := router.DefaultConfig()
	rc.Seed, rc.RegistryTTL = seed, 50*time.Millisecond
	rc.Admission.Enabled = true // as `kvroute serve` runs by default
	// Discovery's series: a source whose one endpoint never answers its
	// /v1/models (a failed lookup, counted; nothing registered).
	gone, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	gonePort := gone.Addr().(*net.TCPAddr).Port
	gone.Close()
	src := fixedSource{eps: []discovery.Endpoint{{Name: "unanswered", Host: "127.0.0.1", HTTPPort: gonePort}}}
	a, err := app.New(ctx, app.Config{
		Listen: "127.0.0.1:0", RedisURL: redistest.Server(t), Router: rc,
		// Model m is tokenized in process and every tokenization shadowed
		// by the replica (whose byte tokenizer disagrees: a mismatch).
		Tokenizers: app.Tokenizers{FS: map[string]fs.FS{model: qwen3.FS}, ShadowRate: 1},
		Tasks: []app.Task{app.Ingest(ingestor.Config{Owner: "metrics-test", Seed: seed,
			RegistryInterval: 100 * time.Millisecond, HealthInterval: 200 * time.Millisecond}),
			app.Discover(app.DiscoverConfig{Sources: []discovery.Source{src}, Interval: 100 * time.Millisecond})},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop() })
	h := &harness{t: t, ctx: ctx, app: a, base: "http://" + a.Addr(), reps: map[string]*vllmtest.Replica{}}
	h.addReplica("live", vllmtest.Config{})
	// A replica that passes its health probes but drops every proxied
	// request before its headers: those fail over. (One that refused
	// connections would be probed unhealthy, and no longer routed to,
	// before the completions below could meet it.)
	dead := "http://" + droppingReplica(t)
	if code, body := h.call("PUT", "/v1/replicas/dead", fmt.Sprintf(`{"model":%q,"url":%q}`, model, dead)); code >= 300 {
		t.Fatalf("register dead: %d %s", code, body)
	}
	h.waitFor("the live replica followed", func() bool {
		code, body := h.call("GET", "/v1/replicas/live", "")
		return code == http.StatusOK && strings.Contains(body, `"followed_since"`)
	})
	tokens := `[` + strings.Repeat("5,", 4*bs) + `5]`
	for range 3 {
		if code, body := h.call("POST", "/v1/route", `{"model":"m","token_ids":`+tokens+`}`); code != http.StatusOK {
			t.Fatalf("route: %d %s", code, body)
		}
	}
	h.call("POST", "/v1/route", `{"model":"m","prompt":"hello there"}`)
	// Prompt embeddings cannot be keyed: a cache-blind decision.
	h.call("POST", "/v1/completions", `{"model":"m","prompt_embeds":"AAAA","max_tokens":1}`)
	h.call("POST", "/v1/route", `{"model":"nope","token_ids":[1]}`)
	for i := 0; i < 50 && !strings.Contains(h.scrape(), "kvroute_proxy_failovers_total{"); i++ {
		code, body := h.call("POST", "/v1/completions", `{"model":"m","prompt":`+tokens+`,"max_tokens":2}`)
		if code != http.StatusOK {
			t.Fatalf("completion: %d %s", code, body)
		}
	}
	h.call("POST", "/v1/completions", `{"model":"m","prompt":`+tokens+`,"max_tokens":2,"stream":true}`)
	// The ingestor's per-replica series appear once it applied the
	// events the completions made the replica publish.
	h.waitFor("the ingestor applied the replica's events", func() bool {
		s := h.scrape()
		return strings.Contains(s, "kvroute_ingest_replica_batches_applied_total{") && strings.Contains(s, `kvroute_ingest_batches_total{result="applied"}`) &&
			strings.Contains(s, `kvroute_discovery_endpoints{source="static:metrics"} 1`)
	})
	return h.scrape()
}

func (h *harness) scrape() string {
	h.t.Helper()
	code, body := h.call("GET", "/metrics", "")
	if code != http.StatusOK {
		h.t.Fatalf("/metrics: %d", code)
	}
	return body
}

// droppingReplica listens on loopback, answers GET /health, and closes the
// connection of every other request before writing a header.
func droppingReplica(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	})}
	go srv.Serve(ln)
	tb.Cleanup(func() { srv.Close() })
	return ln.Addr().String()
}
