package infra_test

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// The monitoring files, relative to infra/ (the tests' directory).
var (
	rulesFile     = filepath.Join("prometheus", "kvroute-rules.yaml")
	rulesTestFile = filepath.Join("prometheus", "kvroute-rules_test.yaml")
	ruleManifest  = filepath.Join("k8s", "components", "monitoring", "prometheusrule.yaml")
	dashboardFile = filepath.Join("grafana", "kvroute-dashboard.json")
)

// ruleFile is a Prometheus rule file (and a PrometheusRule's spec): the
// fields kvroute's rules use, decoded strictly so that a misspelt field
// (fro: 5m) is an error rather than an alert without its for.
type ruleFile struct {
	Groups []ruleGroup `json:"groups"`
}

type ruleGroup struct {
	Name     string `json:"name"`
	Interval string `json:"interval,omitempty"`
	Rules    []rule `json:"rules"`
}

type rule struct {
	Alert       string            `json:"alert,omitempty"`
	Record      string            `json:"record,omitempty"`
	Expr        string            `json:"expr"`
	For         string            `json:"for,omitempty"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

func readRules(tb testing.TB) ruleFile {
	tb.Helper()
	b, err := os.ReadFile(rulesFile)
	if err != nil {
		tb.Fatal(err)
	}
	var f ruleFile
	if err := yaml.UnmarshalStrict(b, &f); err != nil {
		tb.Fatalf("%s: %v", rulesFile, err)
	}
	if len(f.Groups) == 0 {
		tb.Fatalf("%s: no groups", rulesFile)
	}
	return f
}

func (f ruleFile) alerts() []rule {
	var out []rule
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			if r.Alert != "" {
				out = append(out, r)
			}
		}
	}
	return out
}

// lookTool finds a binary the monitoring tests run (promtool and
// prometheus, from Debian's prometheus package; redis-server), which
// scripts/ensure-deps.sh installs. Without it the test is skipped, or fails when CI is set, so
// that CI cannot pass by skipping.
func lookTool(tb testing.TB, name string) string {
	tb.Helper()
	p, err := exec.LookPath(name)
	if err == nil {
		return p
	}
	if os.Getenv("CI") != "" {
		tb.Fatalf("%s is not installed, and CI is set: run scripts/ensure-deps.sh", name)
	}
	tb.Skipf("%s is not installed (scripts/ensure-deps.sh installs it); CI fails here instead", name)
	return ""
}

// TestAlertRules checks the rule file with promtool and runs its unit
// tests (kvroute-rules_test.yaml: input series and the alerts expected of
// them), and holds every alert to what an operator paged needs: a for, a
// severity, a summary, a description, a runbook hint, and a unit test in
// which it fires and one in which it does not.
func TestAlertRules(t *testing.T) {
	rules := readRules(t)
	t.Run("each alert says what and how bad", func(t *testing.T) {
		for _, r := range rules.alerts() {
			if r.For == "" {
				t.Errorf("%s: no for: (one bad evaluation pages)", r.Alert)
			}
			if s := r.Labels["severity"]; s != "critical" && s != "warning" {
				t.Errorf("%s: severity %q, want critical or warning", r.Alert, s)
			}
			for _, a := range []string{"summary", "description", "runbook"} {
				if strings.TrimSpace(r.Annotations[a]) == "" {
					t.Errorf("%s: no %s annotation", r.Alert, a)
				}
			}
		}
	})
	t.Run("each alert has a unit test firing and one not", func(t *testing.T) {
		fires, quiet := unitTestedAlerts(t)
		for _, r := range rules.alerts() {
			if !fires[r.Alert] {
				t.Errorf("%s: no case in %s where it fires", r.Alert, rulesTestFile)
			}
			if !quiet[r.Alert] {
				t.Errorf("%s: no case in %s where it must not fire", r.Alert, rulesTestFile)
			}
		}
	})
	promtool := lookTool(t, "promtool")
	t.Run("promtool check rules", func(t *testing.T) {
		runPromtool(t, promtool, ".", "check", "rules", rulesFile)
	})
	t.Run("promtool test rules", func(t *testing.T) {
		runPromtool(t, promtool, filepath.Dir(rulesTestFile), "test", "rules", filepath.Base(rulesTestFile))
	})
}

func runPromtool(tb testing.TB, promtool, dir string, args ...string) {
	tb.Helper()
	cmd := exec.Command(promtool, args...)
	cmd.Dir = dir
	out, err := cmd.CombinedOutput()
	if err != nil {
		tb.Fatalf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	tb.Logf("promtool %s:\n%s", strings.Join(args, " "), out)
}

// unitTestedAlerts reads the promtool unit tests: the alerts some case
// expects to fire, and those some case expects not to (exp_alerts empty).
func unitTestedAlerts(tb testing.TB) (fires, quiet map[string]bool) {
	tb.Helper()
	b, err := os.ReadFile(rulesTestFile)
	if err != nil {
		tb.Fatal(err)
	}
	var f struct {
		Tests []struct {
			Name          string `json:"name"`
			AlertRuleTest []struct {
				Alertname string            `json:"alertname"`
				ExpAlerts []json.RawMessage `json:"exp_alerts"`
			} `json:"alert_rule_test"`
		} `json:"tests"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		tb.Fatalf("%s: %v", rulesTestFile, err)
	}
	fires, quiet = map[string]bool{}, map[string]bool{}
	for _, tc := range f.Tests {
		for _, a := range tc.AlertRuleTest {
			if len(a.ExpAlerts) > 0 {
				fires[a.Alertname] = true
			} else {
				quiet[a.Alertname] = true
			}
		}
	}
	return fires, quiet
}

// TestPrometheusRuleManifest holds the Prometheus Operator's
// PrometheusRule (infra/k8s/components/monitoring) to the rule file: the
// same groups, rule for rule, so that neither way of loading the alerts
// drifts from the one promtool tests.
func TestPrometheusRuleManifest(t *testing.T) {
	want := readRules(t)
	b, err := os.ReadFile(ruleManifest)
	if err != nil {
		t.Fatal(err)
	}
	o := &objects{}
	if err := o.add(b); err != nil {
		t.Fatalf("%s: %v", ruleManifest, err)
	}
	if len(o.PrometheusRules) != 1 {
		t.Fatalf("%s: %d PrometheusRules, want 1", ruleManifest, len(o.PrometheusRules))
	}
	got := o.PrometheusRules[0].Spec
	if len(got.Groups) != len(want.Groups) {
		t.Fatalf("%s: %d groups, want %d (as %s)", ruleManifest, len(got.Groups), len(want.Groups), rulesFile)
	}
	for i, w := range want.Groups {
		g := got.Groups[i]
		if g.Name != w.Name || g.Interval != w.Interval || len(g.Rules) != len(w.Rules) {
			t.Errorf("group %d: got %s (interval %q, %d rules), want %s (interval %q, %d rules) as %s", i,
				g.Name, g.Interval, len(g.Rules), w.Name, w.Interval, len(w.Rules), rulesFile)
			continue
		}
		for j := range w.Rules {
			if !reflect.DeepEqual(g.Rules[j], w.Rules[j]) {
				t.Errorf("group %s, rule %s differs from %s's:\n\tgot  %+v\n\twant %+v", w.Name, w.Rules[j].Alert, rulesFile, g.Rules[j], w.Rules[j])
			}
		}
	}
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	Panels []panel `json:"panels"`
}

type panel struct {
	ID         int `json:"id"`
	Type       string
	Title      string `json:"title"`
	Datasource *struct {
		UID string `json:"uid"`
	} `json:"datasource"`
	Targets []struct {
		Expr string `json:"expr"`
	} `json:"targets"`
	Panels []panel `json:"panels"` // a collapsed row's
}

func readDashboard(tb testing.TB) []panel {
	tb.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		tb.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		tb.Fatalf("%s: %v", dashboardFile, err)
	}
	var out []panel
	var walk func([]panel)
	walk = func(ps []panel) {
		for _, p := range ps {
			out = append(out, p)
			walk(p.Panels)
		}
	}
	walk(d.Panels)
	return out
}

// dashboardExprs is every PromQL expression of the dashboard's panels.
func dashboardExprs(tb testing.TB) []string {
	tb.Helper()
	var out []string
	for _, p := range readDashboard(tb) {
		for _, tg := range p.Targets {
			out = append(out, tg.Expr)
		}
	}
	return out
}

// TestDashboardMetricNames checks that every panel of the Grafana
// dashboard queries through its datasource variable with expressions
// naming only metrics (and their labels) kvroute serves, and that it
// shows what an operator looks at first.
func TestDashboardMetricNames(t *testing.T) {
	served := servedMetrics(t)
	ids := map[int]string{}
	used := map[string]bool{}
	for _, p := range readDashboard(t) {
		if prev, dup := ids[p.ID]; dup {
			t.Errorf("panels %q and %q share id %d", prev, p.Title, p.ID)
		}
		ids[p.ID] = p.Title
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource is not the ${datasource} variable (an imported dashboard would query nothing)", p.Title)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, name := range checkExpr(t, served, "panel "+p.Title, tg.Expr) {
				used[name] = true
			}
		}
	}
	// What the dashboard is for (issue 23): decisions by policy and
	// outcome, believed vs served cache per replica, load per replica,
	// ingest lag, Redis latency, queue depth.
	for _, name := range []string{"kvroute_decisions_total", "kvroute_cached_tokens_believed_total", "kvroute_cached_tokens_served_total",
		"kvroute_decisions_by_replica_total", "kvroute_ingest_apply_lag_seconds", "kvroute_decision_stage_duration_seconds", "kvroute_queue_depth"} {
		if !used[name] {
			t.Errorf("no panel queries %s", name)
		}
	}
}

// TestRulesMetricNames checks that every alert's expression names only
// metrics (and their labels) kvroute serves.
func TestRulesMetricNames(t *testing.T) {
	served := servedMetrics(t)
	for _, r := range readRules(t).alerts() {
		checkExpr(t, served, "alert "+r.Alert, r.Expr)
	}
}

// metricInfo is what the name checks know of a served metric family.
type metricInfo struct {
	typ    string
	labels []string
}

// beyondGolden are the families kvroute serves that
// tests/testdata/metrics.golden does not list, because TestMetricNames's
// traffic does not make them all: the series it calls late (served once
// their event happens) and added, and the two the api's own tests cover.
// Each is checked to be registered in the code under this name.
var beyondGolden = map[string]metricInfo{
	// api: needs a replica that misreports its cached tokens.
	"kvroute_cache_phantom_total": {"counter", []string{"replica"}},
	// api: need a replica that hangs before its headers, or fails
	// after them.
	"kvroute_proxy_header_timeouts_total": {"counter", []string{"replica"}},
	"kvroute_proxy_stream_errors_total":   {"counter", []string{"replica", "sse"}},
	// router admission: served once a request queues or is shed.
	"kvroute_queue_depth":        {"gauge", []string{"model"}},
	"kvroute_queue_wait_seconds": {"histogram", []string{"model", "outcome", "priority", "tenant"}},
	"kvroute_shed_total":         {"counter", []string{"model", "priority", "reason"}},
	"kvroute_admitted_total":     {"counter", []string{"model", "priority", "queued"}},
	// api: each decision's stages (the store round trips among them).
	"kvroute_decision_stage_duration_seconds": {"histogram", []string{"stage"}},
	// store: served once Redis has failed a command.
	"kvroute_redis_errors_total": {"counter", []string{"operation"}},
}

// servedMetrics is metrics.golden's families with beyondGolden's, each of
// which must be registered by a non-test Go file under its literal name.
func servedMetrics(tb testing.TB) map[string]metricInfo {
	tb.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot(tb), "tests", "testdata", "metrics.golden"))
	if err != nil {
		tb.Fatal(err)
	}
	out := map[string]metricInfo{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(raw)), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			tb.Fatalf("metrics.golden: malformed line %q", line)
		}
		labels := strings.Trim(f[2], "[]")
		out[f[0]] = metricInfo{typ: f[1], labels: strings.Split(labels, ",")}
	}
	src := goSources(tb)
	for name, info := range beyondGolden {
		if _, dup := out[name]; dup {
			tb.Errorf("%s is in metrics.golden now: drop it from beyondGolden", name)
		}
		if !strings.Contains(src, `"`+name+`"`) {
			tb.Errorf("beyondGolden's %s is registered by no Go file: renamed or gone?", name)
		}
		out[name] = info
	}
	return out
}

// goSources is the text of every non-test Go file of the module.
func goSources(tb testing.TB) string {
	tb.Helper()
	var b strings.Builder
	err := filepath.WalkDir(repoRoot(tb), func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "node_modules" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		b.Write(src)
		return err
	})
	if err != nil {
		tb.Fatal(err)
	}
	return b.String()
}

var (
	promString    = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|` + "`[^`]*`")
	promGrouping  = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)`)
	promRange     = regexp.MustCompile(`\[[^\]]*\]`)
	promSelector  = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	promMatcher   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(?:=~|!~|!=|=)`)
	promIdent     = regexp.MustCompile(`\$?[a-zA-Z_:][a-zA-Z0-9_:]*(\s*\()?`)
	promKeywords  = []string{"and", "or", "unless", "bool", "offset", "inf", "nan", "atan2"}
	scrapedLabels = []string{"job", "instance"}
)

// checkExpr reports, as errors naming where, every metric expr names that
// kvroute does not serve, and every label a selector matches that its
// metric does not carry (job and instance come from the scrape; le from
// a histogram's buckets). It returns the families named (a histogram's
// _bucket, _sum and _count as the histogram).
func checkExpr(tb testing.TB, served map[string]metricInfo, where, expr string) []string {
	tb.Helper()
	// Label values and matchers (in strings and braces), label lists of
	// grouping clauses, and ranges name no metric.
	e := promString.ReplaceAllString(expr, `""`)
	for _, m := range promSelector.FindAllStringSubmatch(e, -1) {
		name, info := family(served, m[1])
		if info == nil {
			continue // reported below
		}
		for _, l := range promMatcher.FindAllStringSubmatch(m[2], -1) {
			ok := slices.Contains(info.labels, l[1]) || slices.Contains(scrapedLabels, l[1]) ||
				(l[1] == "le" && m[1] == name+"_bucket")
			if !ok {
				tb.Errorf("%s: %s has no label %s (it has %v): %s", where, m[1], l[1], info.labels, expr)
			}
		}
	}
	e = regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(e, " ")
	e = promGrouping.ReplaceAllString(e, " ")
	e = promRange.ReplaceAllString(e, " ")
	var names []string
	found := 0
	for _, m := range promIdent.FindAllStringSubmatch(e, -1) {
		id := strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(m[0]), "("))
		if m[1] != "" || strings.HasPrefix(id, "$") || slices.Contains(promKeywords, strings.ToLower(id)) {
			continue // a function or aggregation, a Grafana variable, an operator
		}
		found++
		name, info := family(served, id)
		if info == nil {
			tb.Errorf("%s names %s, which kvroute does not serve: %s", where, id, expr)
			continue
		}
		names = append(names, name)
	}
	if found == 0 {
		tb.Errorf("%s: no metric found in %q", where, expr)
	}
	return names
}

// family resolves a series name to its served family: itself, or a
// histogram's (or summary's) family for its _bucket, _sum and _count.
func family(served map[string]metricInfo, name string) (string, *metricInfo) {
	if info, ok := served[name]; ok {
		return name, &info
	}
	for _, suffix := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(name, suffix)
		if !ok {
			continue
		}
		info, ok := served[base]
		if ok && (info.typ == "histogram" || (info.typ == "summary" && suffix != "_bucket")) {
			return base, &info
		}
	}
	return "", nil
}

// errRecorder is a testing.TB that keeps the errors reported to it, for
// checking that a check reports what it should.
type errRecorder struct {
	testing.TB
	errs []string
}

func (r *errRecorder) Helper() {}
func (r *errRecorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}

// TestRulesMetricNamesCheck holds checkExpr itself to what it must find,
// so that the name tests cannot pass by finding nothing.
func TestRulesMetricNamesCheck(t *testing.T) {
	served := servedMetrics(t)
	for _, tc := range []struct {
		name, expr string
		want       []string // substrings of the errors, in order
		families   []string
	}{
		{name: "served names, functions, grouping and strings", families: []string{"kvroute_decisions_total", "kvroute_decisions_total"},
			expr: `sum by (policy, degraded) (rate(kvroute_decisions_total{degraded="true",job=~"$job"}[$__rate_interval])) / ignoring (x) sum(rate(kvroute_decisions_total[5m])) > 0.05`},
		{name: "a histogram's series", families: []string{"kvroute_ingest_apply_lag_seconds", "kvroute_matched_block_ratio"},
			expr: `histogram_quantile(0.99, sum by (le) (rate(kvroute_ingest_apply_lag_seconds_bucket{le="1"}[5m]))) + kvroute_matched_block_ratio_count`},
		{name: "an unknown metric", expr: `rate(kvroute_decisions_totl[5m])`, want: []string{"kvroute_decisions_totl, which kvroute does not serve"}},
		{name: "a gauge is no histogram", expr: `kvroute_store_up_bucket`, want: []string{"kvroute_store_up_bucket, which kvroute does not serve"}},
		{name: "an unknown label", expr: `kvroute_shed_total{reson="ttl"}`, want: []string{"kvroute_shed_total has no label reson"},
			families: []string{"kvroute_shed_total"}},
		{name: "le off a bucket", expr: `kvroute_decision_duration_seconds_count{le="1"}`, want: []string{"has no label le"},
			families: []string{"kvroute_decision_duration_seconds"}},
		{name: "no metric at all", expr: `vector(1)`, want: []string{"no metric found"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &errRecorder{TB: t}
			got := checkExpr(r, served, "test", tc.expr)
			if len(r.errs) != len(tc.want) {
				t.Fatalf("errors: got %q, want %d matching %q", r.errs, len(tc.want), tc.want)
			}
			for i, w := range tc.want {
				if !strings.Contains(r.errs[i], w) {
					t.Errorf("error %d: got %q, want it to contain %q", i, r.errs[i], w)
				}
			}
			if !slices.Equal(got, tc.families) {
				t.Errorf("families: got %q, want %q", got, tc.families)
			}
		})
	}
}
