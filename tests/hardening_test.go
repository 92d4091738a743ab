package tests_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/vllmtest"
)

// TestServeRefusesOpenAdmin is the finding: serve listened on every
// interface with an unauthenticated admin API.
func TestServeRefusesOpenAdmin(t *testing.T) {
	for _, args := range [][]string{
		{"serve", "--listen", "0.0.0.0:0"},
		{"serve", "--listen", ":0", "--demo-replicas", "1"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			out, err := exec.CommandContext(ctx, kvrouteBinary(t), args...).CombinedOutput()
			var ee *exec.ExitError
			if !errorsAs(err, &ee) || ee.ExitCode() != 2 {
				t.Fatalf("exit: %v, want code 2; output %s", err, out)
			}
			if !strings.Contains(string(out), "without a token") {
				t.Errorf("output %q does not say why", out)
			}
		})
	}
}

func errorsAs(err error, ee **exec.ExitError) bool {
	e, ok := err.(*exec.ExitError)
	if ok {
		*ee = e
	}
	return ok
}

// send is a request to the process with any method.
func (p *process) send(t *testing.T, method, path, body string) (int, http.Header, string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, method, p.base+path, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

// TestHardening runs the findings against `kvroute serve` as a
// process: replica addresses (SSRF), unbounded output lengths, and a dead
// replica (a closed loopback port) beside a live simulated one.
func TestHardening(t *testing.T) {
	p := startServe(t)
	t.Run("replica addresses", func(t *testing.T) {
		for _, body := range []string{
			`{"model":"m","url":"file:///etc/passwd"}`,
			`{"model":"m","url":"http://169.254.169.254/latest/meta-data/"}`,
			`{"model":"m","url":"gopher://127.0.0.1:6379/_FLUSHALL"}`,
			`{"model":"m","url":"not a url"}`,
			`{"model":"m","url":"javascript:alert(1)"}`,
			`{"model":"m","url":"http://user:pass@127.0.0.1:1"}`,
			`{"model":"m","url":"http://127.0.0.1:1","events":"tcp://169.254.169.254:5557"}`,
		} {
			if status, _, raw := p.send(t, http.MethodPut, "/v1/replicas/x", body); status != http.StatusBadRequest {
				t.Errorf("PUT %s: %d %s, want 400", body, status, raw)
			}
		}
		if _, _, raw := p.send(t, http.MethodGet, "/v1/replicas", ""); strings.Contains(raw, `"x"`) {
			t.Errorf("registry holds a refused replica: %s", raw)
		}
	})

	live, err := vllmtest.New(vllmtest.Config{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if err := live.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = live.Stop() })
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := "http://" + ln.Addr().String()
	ln.Close()
	for id, url := range map[string]string{"dead": dead, "live": live.URL()} {
		if status, _, raw := p.send(t, http.MethodPut, "/v1/replicas/"+id, fmt.Sprintf(`{"model":"m","url":%q}`, url)); status != http.StatusCreated {
			t.Fatalf("register %s: %d %s", id, status, raw)
		}
	}

	t.Run("a dead replica costs no request", func(t *testing.T) {
		for i := range 40 {
			body := fmt.Sprintf(`{"model":"m","prompt":[%d,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17],"max_tokens":2}`, 1000+i)
			status, hdr, raw := p.post(t, "/v1/completions", body)
			if status != http.StatusOK || hdr.Get("X-Kvroute-Replica") != "live" {
				t.Fatalf("request %d: %d from %q: %s", i, status, hdr.Get("X-Kvroute-Replica"), raw)
			}
		}
		_, metrics := p.get(t, "/metrics")
		t.Logf("failovers from dead: %v (0 if the health probe marked it first)", sumSeries(metrics, `kvroute_proxy_failovers_total{replica="dead"}`))
	})
	t.Run("output lengths are bounded", func(t *testing.T) {
		for _, tc := range []struct{ path, body, field string }{
			{"/v1/route", `{"model":"m","token_ids":[1],"max_tokens":1000000000}`, `"field":"max_tokens"`},
			{"/v1/route", `{"model":"m","token_ids":[1],"max_tokens":9223372036854775807}`, `"field":"max_tokens"`},
			{"/v1/completions", `{"model":"m","prompt":[1],"max_tokens":1000000000000000000}`, `"param":"max_tokens"`},
		} {
			status, _, raw := p.post(t, tc.path, tc.body)
			if status != http.StatusBadRequest || !strings.Contains(raw, tc.field) {
				t.Errorf("%s %s: %d %s, want 400 naming max_tokens", tc.path, tc.body, status, raw)
			}
		}
	})
	t.Run("metrics", func(t *testing.T) {
		_, metrics := p.get(t, "/metrics")
		for _, want := range []string{`kvroute_decisions_by_replica_total{replica="live"}`, `kvroute_proxied_requests_total{status="200"} 40`, `kvroute_registry_replicas{`} {
			if !strings.Contains(metrics, want) {
				t.Errorf("/metrics lacks %s", want)
			}
		}
	})
}
