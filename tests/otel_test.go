package tests_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/router"
)

// tracedUpstream is a replica that records the traceparent of every
// request and answers an OpenAI completion.
type tracedUpstream struct {
	*httptest.Server
	mu     sync.Mutex
	parent []string
}

func newTracedUpstream(t *testing.T) *tracedUpstream {
	t.Helper()
	u := &tracedUpstream{}
	u.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		u.parent = append(u.parent, r.Header.Get("Traceparent"))
		u.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"id":"c","object":"text_completion","choices":[{"index":0,"text":"ok","finish_reason":"length"}],` +
			`"usage":{"prompt_tokens":48,"completion_tokens":1,"total_tokens":49,"prompt_tokens_details":{"cached_tokens":0}}}`))
	}))
	t.Cleanup(u.Close)
	return u
}

func (u *tracedUpstream) last() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	if len(u.parent) == 0 {
		return ""
	}
	return u.parent[len(u.parent)-1]
}

// syncBuffer is a log sink the server writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// waitFor waits until sub appears in the buffer. The access log line is
// written after the response has gone out, so a client can read its
// answer before the line exists.
func (s *syncBuffer) waitFor(t *testing.T, sub string) {
	t.Helper()
	wait.UntilNil(t, "log line "+sub, func() error {
		if b := s.String(); !strings.Contains(b, sub) {
			return fmt.Errorf("the logs so far:\n%s", b)
		}
		return nil
	})
}

// tracedPod is an in-process pod (configured, like `kvroute serve`, by
// the OTEL_* environment) over a real redis-server with one replica, up.
type tracedPod struct {
	base, redisURL string
	logs           *syncBuffer
	// stop stops the pod (once; the test's cleanup calls it too), which
	// flushes its span exporter, if any.
	stop func()
}

func newTracedPod(t *testing.T, up *tracedUpstream) *tracedPod {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	p := &tracedPod{redisURL: redistest.Server(t), logs: &syncBuffer{}}
	rc := router.DefaultConfig()
	rc.RegistryTTL = 50 * time.Millisecond
	a, err := app.New(ctx, app.Config{Listen: "127.0.0.1:0", RedisURL: p.redisURL, Router: rc,
		Logger: slog.New(slog.NewJSONHandler(p.logs, nil)), AccessLog: api.AccessLogAll})
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	p.stop = sync.OnceFunc(func() { _ = a.Stop() })
	t.Cleanup(p.stop)
	p.base = "http://" + a.Addr()
	if code, _, body := p.send(t, "PUT", "/v1/replicas/up", fmt.Sprintf(`{"model":"m","url":%q}`, up.URL), ""); code >= 300 {
		t.Fatalf("register: %d %s", code, body)
	}
	return p
}

// send makes a request, with traceparent when not empty.
func (p *tracedPod) send(t *testing.T, method, path, body, traceparent string) (int, http.Header, string) {
	t.Helper()
	req, err := http.NewRequest(method, p.base+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if traceparent != "" {
		req.Header.Set("Traceparent", traceparent)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, resp.Header, b.String()
}

// 48 tokens: three full blocks of 16.
const tracedPrompt = `[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33,34,35,36,37,38,39,40,41,42,43,44,45,46,47,48]`

// TestTracing exports a pod's traces to a real OTLP/HTTP receiver on
// loopback and checks what an operator reads in them: a decision's span
// tree with its Redis calls and the chosen replica, an incoming
// traceparent as the parent, a proxied request's traceparent at the
// replica, log lines carrying their trace, and Redis errors counted.
func TestTracing(t *testing.T) {
	rcv := newOTLPReceiver(t)
	otelEnv(t, rcv, "http/protobuf")
	up := newTracedUpstream(t)
	pod := newTracedPod(t, up)
	const caller = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	callerTrace, callerSpan := "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

	t.Run("decision span tree", func(t *testing.T) {
		code, _, body := pod.send(t, "POST", "/v1/route", `{"model":"m","token_ids":`+tracedPrompt+`}`, caller)
		if code != http.StatusOK {
			t.Fatalf("route: %d %s", code, body)
		}
		var resp struct {
			Replica struct{ ID string } `json:"replica"`
		}
		_ = json.Unmarshal([]byte(body), &resp)
		tr := rcv.trace(callerTrace, func(tr map[string]otlpSpan) bool {
			return len(named(tr, "POST /v1/route")) == 1 && len(named(tr, "kvroute.decision")) == 1
		})
		server := named(tr, "POST /v1/route")[0]
		if server.Parent != callerSpan || server.Kind != "SPAN_KIND_SERVER" {
			t.Errorf("server span: parent %s kind %s, want the caller's span %s, SPAN_KIND_SERVER", server.Parent, server.Kind, callerSpan)
		}
		dec := named(tr, "kvroute.decision")[0]
		if dec.Parent != server.ID {
			t.Errorf("decision's parent = %s, want the server span %s", dec.Parent, server.ID)
		}
		kids := children(tr, dec.ID)
		for _, want := range []string{"kvroute.tokenize", "kvroute.registry", "kvroute.keying", "kvroute.lookup", "kvroute.scoring", "kvroute.reserve"} {
			if kids[want] != 1 {
				t.Errorf("decision's children %v: want one %s", kids, want)
			}
		}
		for name, want := range map[string]string{
			"kvroute.replica": resp.Replica.ID, "kvroute.model": "m", "kvroute.prompt_blocks": "3", "kvroute.matched_blocks": "0",
			"kvroute.policy": "kv", "kvroute.degraded": "false", "kvroute.tokenization": "given",
		} {
			if got := dec.Attrs[name]; got != want || want == "" {
				t.Errorf("decision %s = %q, want %q", name, got, want)
			}
		}
		// A 3-block chain is looked up by a plain read of its blocks (a
		// pipeline of HMGETs), not lookup.lua.
		for stage, script := range map[string]string{"kvroute.lookup": "redis.pipeline hmget", "kvroute.reserve": "reserve.lua"} {
			s := named(tr, stage)[0]
			found := false
			for _, c := range tr {
				if c.Parent == s.ID && c.Attrs["db.system"] == "redis" && strings.Contains(c.Name, script) {
					found = true
				}
			}
			if !found {
				t.Errorf("%s has no Redis child running %s; trace:\n%s", stage, script, describeSpans(tr))
			}
		}
		if got := dec.Resource["service.name"]; got != "kvroute-test" {
			t.Errorf("service.name = %q, want OTEL_SERVICE_NAME's kvroute-test", got)
		}
	})

	t.Run("proxied request carries traceparent", func(t *testing.T) {
		code, _, body := pod.send(t, "POST", "/v1/completions", `{"model":"m","prompt":`+tracedPrompt+`,"max_tokens":1}`, "")
		if code != http.StatusOK {
			t.Fatalf("completion: %d %s", code, body)
		}
		traceID, parent := parseTraceparent(t, up.last())
		tr := rcv.trace(traceID, func(tr map[string]otlpSpan) bool {
			return len(named(tr, "POST /v1/completions")) == 1 && tr[parent].Name != ""
		})
		proxy, server := tr[parent], named(tr, "POST /v1/completions")[0]
		if proxy.Name != "kvroute.proxy" || proxy.Kind != "SPAN_KIND_CLIENT" || proxy.Attrs["kvroute.replica"] != "up" || proxy.Attrs["http.response.status_code"] != "200" {
			t.Errorf("the replica's parent span = %+v, want kvroute.proxy (client) to up, 200", proxy)
		}
		if proxy.Parent != server.ID || server.Parent != "" {
			t.Errorf("proxy's parent %s, server's %q: want the server span %s, a root", proxy.Parent, server.Parent, server.ID)
		}
		if d := named(tr, "kvroute.decision"); len(d) != 1 || d[0].Parent != server.ID {
			t.Errorf("want one decision under the server span, got %+v", d)
		}
	})

	t.Run("incoming traceparent reaches the replica", func(t *testing.T) {
		in := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		if code, _, body := pod.send(t, "POST", "/v1/completions", `{"model":"m","prompt":`+tracedPrompt+`,"max_tokens":1}`, in); code != http.StatusOK {
			t.Fatalf("completion: %d %s", code, body)
		}
		traceID, parent := parseTraceparent(t, up.last())
		if traceID != "0af7651916cd43dd8448eb211c80319c" || parent == "b7ad6b7169203331" {
			t.Errorf("replica got %s, want the caller's trace with kvroute's proxy span as parent", up.last())
		}
	})

	t.Run("logs carry the trace", func(t *testing.T) {
		pod.logs.waitFor(t, `"path":"/v1/route"`)
		var found bool
		for line := range strings.SplitSeq(pod.logs.String(), "\n") {
			var rec struct{ Msg, Path, TraceID, SpanID string }
			_ = json.Unmarshal([]byte(line), &struct {
				Msg     *string `json:"msg"`
				Path    *string `json:"path"`
				TraceID *string `json:"trace_id"`
				SpanID  *string `json:"span_id"`
			}{&rec.Msg, &rec.Path, &rec.TraceID, &rec.SpanID})
			if rec.Msg == "http" && rec.Path == "/v1/route" {
				found = true
				if rec.TraceID != callerTrace || len(rec.SpanID) != 16 {
					t.Errorf("access log line %s: want trace_id %s and a span_id", line, callerTrace)
				}
			}
		}
		if !found {
			t.Errorf("no access log line for /v1/route in:\n%s", pod.logs.String())
		}
	})

	t.Run("redis errors counted", func(t *testing.T) {
		// The registry made the wrong type: every read of it fails.
		opt, _ := redis.ParseURL(pod.redisURL)
		rc := redis.NewClient(opt)
		defer rc.Close()
		if err := rc.Del(context.Background(), "kvr:replicas").Err(); err != nil {
			t.Fatal(err)
		}
		if err := rc.Set(context.Background(), "kvr:replicas", "x", 0).Err(); err != nil {
			t.Fatal(err)
		}
		// Once the pod's registry copy is past RegistryTTL, a route
		// reads it again and fails.
		in := "00-11111111111111111111111111111111-2222222222222222-01"
		wait.Until(t, "a route over the broken registry answering a 5xx", func() bool {
			code, _, _ := pod.send(t, "POST", "/v1/route", `{"model":"m","token_ids":[1]}`, in)
			return code >= 500
		})
		_, _, metrics := pod.send(t, "GET", "/metrics", "", "")
		if !strings.Contains(metrics, `kvroute_redis_errors_total{operation="hgetall"}`) {
			t.Errorf("no hgetall error counted:\n%s", grepLines(metrics, "redis_errors"))
		}
		tr := rcv.trace("11111111111111111111111111111111", func(tr map[string]otlpSpan) bool { return len(named(tr, "hgetall")) == 1 })
		if h := named(tr, "hgetall")[0]; !h.Error || tr[h.Parent].Name != "kvroute.registry" || !tr[h.Parent].Error {
			t.Errorf("hgetall span %+v: want an error under an errored kvroute.registry", h)
		}
	})
}

// TestTracingOff: with no exporter configured nothing is exported, and an
// incoming traceparent still reaches the replica unchanged (the no-op
// tracer keeps the caller's span as the context) and the logs.
func TestTracingOff(t *testing.T) {
	rcv := newOTLPReceiver(t)
	for _, k := range []string{"OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_TRACES_EXPORTER"} {
		t.Setenv(k, "")
	}
	up := newTracedUpstream(t)
	pod := newTracedPod(t, up)
	in := "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	if code, _, body := pod.send(t, "POST", "/v1/completions", `{"model":"m","prompt":`+tracedPrompt+`,"max_tokens":1}`, in); code != http.StatusOK {
		t.Fatalf("completion: %d %s", code, body)
	}
	if got := up.last(); got != in {
		t.Errorf("replica got traceparent %q, want the caller's %q", got, in)
	}
	pod.logs.waitFor(t, `"trace_id":"0af7651916cd43dd8448eb211c80319c"`)
	// Stopping the pod flushes an exporter if there were one.
	pod.stop()
	if n := len(rcv.all()); n != 0 {
		t.Errorf("%d spans exported with no exporter configured", n)
	}
}

// TestTracingProcess runs `kvroute serve` as a process configured by
// OTEL_* alone, exporting over OTLP/gRPC: its decisions reach the
// receiver with the resource the environment names.
func TestTracingProcess(t *testing.T) {
	rcv := newOTLPReceiver(t)
	otelEnv(t, rcv, "grpc")
	up := newTracedUpstream(t)
	p := startServe(t, "--redis-url", redistest.Server(t))
	if code, _, body := p.send(t, "PUT", "/v1/replicas/up", fmt.Sprintf(`{"model":"m","url":%q}`, up.URL)); code >= 300 {
		t.Fatalf("register: %d %s", code, body)
	}
	if code, _, body := p.post(t, "/v1/completions", `{"model":"m","prompt":`+tracedPrompt+`,"max_tokens":1}`); code != http.StatusOK {
		t.Fatalf("completion: %d %s", code, body)
	}
	traceID, parent := parseTraceparent(t, up.last())
	tr := rcv.trace(traceID, func(tr map[string]otlpSpan) bool {
		return tr[parent].Name != "" && len(named(tr, "kvroute.decision")) == 1 && len(named(tr, "kvroute.reserve")) == 1
	})
	dec := named(tr, "kvroute.decision")[0]
	if dec.Attrs["kvroute.replica"] != "up" || dec.Resource["service.name"] != "kvroute-test" || dec.Resource["deployment.environment.name"] != "test" {
		t.Errorf("decision %+v: want replica up, service kvroute-test, environment test", dec)
	}
	if tr[parent].Name != "kvroute.proxy" {
		t.Errorf("the replica's parent is %q, want kvroute.proxy", tr[parent].Name)
	}
}
