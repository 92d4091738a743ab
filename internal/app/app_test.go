package app_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/vllmtest"
)

func startApp(tb testing.TB, cfg app.Config) string {
	tb.Helper()
	cfg.Listen = "127.0.0.1:0"
	if cfg.Router.BlockSize == 0 {
		cfg.Router = router.DefaultConfig()
	}
	a, err := app.New(context.Background(), cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := a.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := a.Stop(); err != nil {
			tb.Errorf("stop: %v", err)
		}
	})
	return "http://" + a.Addr()
}

func call(tb testing.TB, method, url, body string) (int, string) {
	tb.Helper()
	req, err := http.NewRequest(method, url, strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

func route(tb testing.TB, base string, tokens []int) api.RouteResponse {
	tb.Helper()
	b, _ := json.Marshal(map[string]any{"model": "m", "token_ids": tokens})
	status, raw := call(tb, http.MethodPost, base+"/v1/route", string(b))
	if status != http.StatusOK {
		tb.Fatalf("route: status %d: %s", status, raw)
	}
	var d api.RouteResponse
	if err := json.Unmarshal([]byte(raw), &d); err != nil {
		tb.Fatal(err)
	}
	return d
}

func seq(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

// TestServeRealRedis runs the production wiring against a real
// redis-server: the Lua scripts, the registry and the leases are the
// store's own, only the replicas are fictitious (they publish no events, so
// the router works from its approximate entries).
func TestServeRealRedis(t *testing.T) {
	base := startApp(t, app.Config{RedisURL: redistest.Server(t)})
	ids := []string{"r0", "r1", "r2"}
	for _, id := range ids {
		status, raw := call(t, http.MethodPut, base+"/v1/replicas/"+id, `{"model":"m","url":"http://`+id+`.invalid:8000"}`)
		if status != http.StatusCreated {
			t.Fatalf("PUT %s: %d %s", id, status, raw)
		}
	}

	t.Run("decision", func(t *testing.T) {
		d := route(t, base, seq(0, 40))
		if d.Replica.ID == "" || d.PromptBlocks != 2 || d.Degraded {
			t.Errorf("decision %+v", d)
		}
		call(t, http.MethodPost, base+"/v1/requests/"+d.RequestID+"/release", "")
	})

	t.Run("repeat goes to the same replica", func(t *testing.T) {
		prompt := seq(5000, 64)
		first := route(t, base, prompt)
		status, raw := call(t, http.MethodPost, base+"/v1/requests/"+first.RequestID+"/release", "")
		if status != http.StatusOK || !strings.Contains(raw, `"found":true`) {
			t.Fatalf("release: %d %s", status, raw)
		}
		second := route(t, base, prompt)
		if second.Replica.ID != first.Replica.ID {
			t.Errorf("repeat went to %s, first to %s", second.Replica.ID, first.Replica.ID)
		}
		if !second.Approximate || second.MatchedBlocks != 4 {
			t.Errorf("repeat matched %d approximate=%v, want 4 true", second.MatchedBlocks, second.Approximate)
		}
		call(t, http.MethodPost, base+"/v1/requests/"+second.RequestID+"/release", "")
	})

	t.Run("sessions sharing a system prompt spread", func(t *testing.T) {
		system := seq(90_000, 64)
		count := map[string]int{}
		for i := range 30 {
			d := route(t, base, append(append([]int(nil), system...), seq(100_000+i*1000, 64)...))
			count[d.Replica.ID]++
		}
		for _, id := range ids {
			if count[id] == 0 {
				t.Errorf("replica %s got none of 30 sessions: %v", id, count)
			}
		}
	})

	t.Run("replica detail", func(t *testing.T) {
		status, raw := call(t, http.MethodGet, base+"/v1/replicas/r0", "")
		var d api.ReplicaDetail
		if err := json.Unmarshal([]byte(raw), &d); status != http.StatusOK || err != nil {
			t.Fatalf("%d %s %v", status, raw, err)
		}
		if d.ID != "r0" || d.Load == nil || d.Load.Requests == 0 {
			t.Errorf("detail %s, want r0 with the sessions' load", raw)
		}
	})

	t.Run("delete", func(t *testing.T) {
		if status, raw := call(t, http.MethodDelete, base+"/v1/replicas/r2", ""); status != http.StatusNoContent {
			t.Fatalf("delete: %d %s", status, raw)
		}
		if status, _ := call(t, http.MethodDelete, base+"/v1/replicas/r2", ""); status != http.StatusNotFound {
			t.Errorf("second delete: %d, want 404", status)
		}
		for range 10 {
			if d := route(t, base, seq(0, 16)); d.Replica.ID == "r2" {
				t.Fatal("routed to a deleted replica")
			}
		}
	})
}

// TestServeEmbedded is the zero-setup mode: no Redis URL, miniredis in the
// process.
func TestServeEmbedded(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "replicas.json")
	if err := os.WriteFile(file, []byte(`[{"id":"a","model":"m","url":"http://a.invalid"},{"id":"b","model":"m","url":"http://b.invalid"}]`), 0o600); err != nil {
		t.Fatal(err)
	}
	base := startApp(t, app.Config{ReplicasFile: file})
	for _, path := range []string{"/healthz", "/readyz"} {
		if status, raw := call(t, http.MethodGet, base+path, ""); status != http.StatusOK {
			t.Errorf("%s: %d %s", path, status, raw)
		}
	}
	status, raw := call(t, http.MethodGet, base+"/v1/replicas", "")
	if status != http.StatusOK || !strings.Contains(raw, `"id":"a"`) || !strings.Contains(raw, `"id":"b"`) {
		t.Errorf("replicas from file: %d %s", status, raw)
	}
	if d := route(t, base, seq(0, 32)); d.Replica.ID != "a" && d.Replica.ID != "b" {
		t.Errorf("decision %+v", d)
	}
	status, raw = call(t, http.MethodGet, base+"/metrics", "")
	if status != http.StatusOK || !strings.Contains(raw, "kvroute_decisions_total") || !strings.Contains(raw, "go_goroutines") {
		t.Errorf("metrics lack kvroute or Go series: %d", status)
	}
}

func TestLoadReplicasFile(t *testing.T) {
	dir := t.TempDir()
	tests := []struct {
		name, content, wantErr string
	}{
		{"valid", `[{"id":"a","model":"m","url":"http://a"}]`, ""},
		{"invalid entry", `[{"id":"a","model":"m","url":"http://a"},{"id":"b","model":"m"}]`, "entry 1: url"},
		{"duplicate", `[{"id":"a","model":"m","url":"http://a"},{"id":"a","model":"m","url":"http://b"}]`, "duplicate"},
		{"unknown field", `[{"id":"a","model":"m","url":"http://a","weight":1}]`, "weight"},
		{"not an array", `{"id":"a"}`, "cannot unmarshal"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(dir, fmt.Sprintf("%d.json", i))
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := app.LoadReplicasFile(path)
			if tt.wantErr == "" && err != nil {
				t.Fatalf("err = %v, want nil", err)
			}
			if tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Fatalf("err = %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
	t.Run("missing file", func(t *testing.T) {
		if _, err := app.LoadReplicasFile(filepath.Join(dir, "nope.json")); err == nil {
			t.Error("no error for a missing file")
		}
	})
}

// lineSignal is a log writer that signals ch (without blocking) for
// every line containing sub.
type lineSignal struct {
	sub string
	ch  chan struct{}
}

func (l lineSignal) Write(p []byte) (int, error) {
	if strings.Contains(string(p), l.sub) {
		select {
		case l.ch <- struct{}{}:
		default:
		}
	}
	return len(p), nil
}

// TestRun checks the start/stop pair: Run serves until its context ends,
// then returns cleanly, and a bad Redis fails before serving.
func TestRun(t *testing.T) {
	t.Run("stops on cancel", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		serving := make(chan struct{}, 1)
		log := slog.New(slog.NewTextHandler(lineSignal{sub: "msg=serving", ch: serving}, nil))
		go func() {
			done <- app.Run(ctx, app.Config{Listen: "127.0.0.1:0", Router: router.DefaultConfig(), Logger: log})
		}()
		wait.Recv(t, "the serving log line", serving)
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run = %v, want nil", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return after cancel")
		}
	})
	t.Run("unreachable redis", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err := app.Run(ctx, app.Config{Listen: "127.0.0.1:0", RedisURL: "redis://127.0.0.1:1", Router: router.DefaultConfig()})
		if err == nil {
			t.Error("Run succeeded without a Redis")
		}
	})
	t.Run("task runs from start to stop", func(t *testing.T) {
		started, stopped := make(chan struct{}), make(chan struct{})
		a, err := app.New(context.Background(), app.Config{Listen: "127.0.0.1:0", Router: router.DefaultConfig(), Tasks: []app.Task{{
			Name: "probe",
			Run: func(ctx context.Context, a *app.App) error {
				if a.Store == nil {
					t.Error("task got no store")
				}
				close(started)
				<-ctx.Done()
				close(stopped)
				return nil
			},
		}}})
		if err != nil {
			t.Fatal(err)
		}
		if err := a.Start(); err != nil {
			t.Fatal(err)
		}
		<-started
		if err := a.Stop(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-stopped:
		default:
			t.Error("Stop returned before the task ended")
		}
	})
}

// TestDyingTaskStopsTheProcess is the lifecycle's promise: a task routing
// depends on (here a stand-in for the embedded ingestor) that dies makes
// /readyz fail while the pod still answers, and then the process stops
// with the task's error instead of serving a frozen index.
func TestDyingTaskStopsTheProcess(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"with an error", errors.New("event loop crashed")},
		{"without one", nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			die := make(chan struct{})
			a, err := app.New(context.Background(), app.Config{
				Listen: "127.0.0.1:0", Router: router.DefaultConfig(), FailDelay: 500 * time.Millisecond,
				Tasks: []app.Task{{Name: "ingestor", Run: func(ctx context.Context, _ *app.App) error {
					select {
					case <-die:
						return tc.err
					case <-ctx.Done():
						return nil
					}
				}}},
			})
			if err != nil {
				t.Fatal(err)
			}
			if err := a.Start(); err != nil {
				t.Fatal(err)
			}
			defer a.Stop()
			base := "http://" + a.Addr()
			if status, body := call(t, http.MethodGet, base+"/readyz", ""); status != http.StatusOK {
				t.Fatalf("readyz before = %d %s, want 200", status, body)
			}
			close(die)
			deadline := time.Now().Add(400 * time.Millisecond)
			for {
				status, body := call(t, http.MethodGet, base+"/readyz", "")
				if status == http.StatusServiceUnavailable {
					if !strings.Contains(body, "ingestor") {
						t.Errorf("readyz body = %s, want it to name the task", body)
					}
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("readyz = %d %s after the task died, want 503", status, body)
				}
				time.Sleep(10 * time.Millisecond)
			}
			select {
			case <-a.Done():
			case <-time.After(5 * time.Second):
				t.Fatal("the process did not stop after its task died")
			}
			if err := a.Err(); err == nil || !strings.Contains(err.Error(), "task ingestor") {
				t.Errorf("Err = %v, want the task's failure", err)
			}
			if err := a.Stop(); err == nil {
				t.Error("Stop = nil after a task died, want the failure (a non-zero exit)")
			}
		})
	}
}

// TestProxyThroughSimReplica sends an OpenAI streaming request through
// kvroute to a simulated vLLM replica over a real Redis: the stream must
// arrive whole, and the booking must be gone once it ends.
func TestProxyThroughSimReplica(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rep, err := vllmtest.New(vllmtest.Config{Model: "m", DecodeTokensPerSec: 500})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rep.Stop() })
	base := startApp(t, app.Config{RedisURL: redistest.Server(t)})
	if status, raw := call(t, http.MethodPut, base+"/v1/replicas/sim0", `{"model":"m","url":"`+rep.URL()+`"}`); status != http.StatusCreated {
		t.Fatalf("PUT: %d %s", status, raw)
	}

	b, _ := json.Marshal(map[string]any{"model": "m", "prompt": seq(1, 48), "max_tokens": 8, "stream": true})
	resp, err := http.Post(base+"/v1/completions", "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get(api.HeaderReplica) != "sim0" {
		t.Fatalf("status %d replica %q: %s", resp.StatusCode, resp.Header.Get(api.HeaderReplica), body)
	}
	if n := strings.Count(string(body), "data: "); n < 3 || !strings.Contains(string(body), "data: [DONE]") {
		t.Errorf("stream has %d events, want several ending in [DONE]: %s", n, body)
	}
	status, raw := call(t, http.MethodGet, base+"/v1/replicas/sim0", "")
	var d api.ReplicaDetail
	if err := json.Unmarshal([]byte(raw), &d); status != http.StatusOK || err != nil {
		t.Fatalf("%d %s %v", status, raw, err)
	}
	if d.Load == nil || d.Load.Requests != 0 || d.Load.PrefillBlocks != 0 || d.Load.DecodeBlocks != 0 {
		t.Errorf("load after the stream = %s, want it released", raw)
	}
}

// TestReadyWaitsForDemoReplicas: in the try-it mode the port is up a moment
// before the demo replicas are registered (the tokenizer loads first); a
// pod that said ready then would answer the first chat with 404. /readyz
// fails, naming the task, until they are, and the replicas are there the
// moment it passes.
func TestReadyWaitsForDemoReplicas(t *testing.T) {
	base := startApp(t, app.Config{Tasks: []app.Task{app.DemoReplicas(2, io.Discard)}})
	sawStarting := false
	wait.UntilNil(t, "/readyz to pass", func() error {
		code, body := call(t, http.MethodGet, base+"/readyz", "")
		if code == http.StatusOK {
			return nil
		}
		if strings.Contains(body, "demo-replicas") {
			sawStarting = true
		}
		return fmt.Errorf("%d %s", code, body)
	})
	code, body := call(t, http.MethodGet, base+"/v1/replicas", "")
	var reps struct {
		Replicas []json.RawMessage `json:"replicas"`
	}
	if err := json.Unmarshal([]byte(body), &reps); code != http.StatusOK || err != nil || len(reps.Replicas) != 2 {
		t.Fatalf("/v1/replicas right after /readyz passed: %d %s (%v); want the 2 demo replicas", code, body, err)
	}
	if !sawStarting {
		t.Log("the replicas were registered before the first probe (nothing to see)")
	}
}
