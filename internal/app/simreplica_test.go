package app_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/vllmtest"
)

func freeLoopback(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// TestRunSimReplica: a simulated replica serves until its context ends,
// then answers the request in flight before it returns (SIGTERM in a
// container must not cut a completion off); a port already taken is an
// error, not a replica that never listened.
func TestRunSimReplica(t *testing.T) {
	t.Run("a request in flight is answered after the context ends", func(t *testing.T) {
		addr := freeLoopback(t)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() {
			done <- app.RunSimReplica(ctx, app.SimReplicaConfig{Model: "demo", Listen: addr,
				Events: "tcp://" + freeLoopback(t), Replay: "tcp://" + freeLoopback(t), DecodeTokensPerSec: 40})
		}()
		wait.UntilNil(t, "the replica to answer /health", func() error {
			resp, err := http.Get("http://" + addr + "/health")
			if err == nil {
				resp.Body.Close()
			}
			return err
		})
		answered := make(chan int, 1)
		go func() {
			// 20 tokens at 40 a second: half a second in flight.
			resp, err := http.Post("http://"+addr+"/v1/completions", "application/json",
				strings.NewReader(`{"model":"demo","prompt":"hello there","max_tokens":20}`))
			if err != nil {
				answered <- 0
				return
			}
			resp.Body.Close()
			answered <- resp.StatusCode
		}()
		wait.Until(t, "the request in flight", func() bool {
			resp, err := http.Get("http://" + addr + "/metrics")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return regexp.MustCompile(`(?m)^vllm:num_requests_running(\{[^}]*\})? 1$`).Match(b)
		})
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunSimReplica = %v, want nil", err)
		}
		// The process exits when RunSimReplica returns: the answer must
		// be out by then.
		select {
		case got := <-answered:
			if got != http.StatusOK {
				t.Errorf("the request in flight at shutdown got %d, want 200", got)
			}
		case <-time.After(100 * time.Millisecond):
			t.Error("RunSimReplica returned before the request in flight was answered")
		}
	})
	t.Run("a port in use fails the start", func(t *testing.T) {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		err = app.RunSimReplica(context.Background(), app.SimReplicaConfig{Model: "demo", Listen: l.Addr().String(),
			Events: "tcp://" + freeLoopback(t), Replay: "tcp://" + freeLoopback(t)})
		if err == nil || !strings.Contains(err.Error(), "listen") {
			t.Errorf("RunSimReplica on a taken port = %v, want a listen error", err)
		}
	})
}

// runSimReplica starts RunSimReplica on free loopback ports and returns its
// base URL once it answers /health; it stops when the test ends.
func runSimReplica(t *testing.T, c app.SimReplicaConfig) string {
	t.Helper()
	c.Model, c.Listen = "demo", freeLoopback(t)
	c.Events, c.Replay = "tcp://"+freeLoopback(t), "tcp://"+freeLoopback(t)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- app.RunSimReplica(ctx, c) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("RunSimReplica = %v, want nil", err)
		}
	})
	url := "http://" + c.Listen
	wait.UntilNil(t, "the replica to answer /health", func() error {
		resp, err := http.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err
	})
	return url
}

// postCompletion sends a completion and returns its status and body.
func postCompletion(ctx context.Context, url, body string) (int, string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url+"/v1/completions", strings.NewReader(body))
	if err != nil {
		return 0, "", err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// TestRunSimReplicaScheduler: MaxNumSeqs and SchedulingPolicy reach the
// replica: past MaxNumSeqs requests wait, counted in vLLM's gauges on
// /metrics, and the default fcfs policy refuses a priority that the
// priority policy accepts.
func TestRunSimReplicaScheduler(t *testing.T) {
	t.Run("past max-num-seqs requests wait", func(t *testing.T) {
		url := runSimReplica(t, app.SimReplicaConfig{MaxNumSeqs: 1, DecodeTokensPerSec: 1,
			SchedulingPolicy: vllmtest.PolicyPriority})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		finished := make(chan struct{}, 2)
		for _, body := range []string{`{"prompt":"hello","max_tokens":1000}`, `{"prompt":"hello","max_tokens":1000,"priority":7}`} {
			go func() {
				_, _, _ = postCompletion(ctx, url, body)
				finished <- struct{}{}
			}()
		}
		run := regexp.MustCompile(`(?m)^vllm:num_requests_running\{engine="0",model_name="demo"\} 1$`)
		waiting := regexp.MustCompile(`(?m)^vllm:num_requests_waiting\{engine="0",model_name="demo"\} 1$`)
		wait.Until(t, "1 running and 1 waiting", func() bool {
			resp, err := http.Get(url + "/metrics")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return run.Match(b) && waiting.Match(b)
		})
		cancel()
		wait.Recv(t, "the first request to end", finished)
		wait.Recv(t, "the second request to end", finished)
	})
	t.Run("fcfs by default refuses a priority", func(t *testing.T) {
		url := runSimReplica(t, app.SimReplicaConfig{})
		status, body, err := postCompletion(context.Background(), url, `{"prompt":"hello","max_tokens":1,"priority":2}`)
		want := "Got priority 2 but Priority scheduling is not enabled."
		if err != nil || status != http.StatusBadRequest || !strings.Contains(body, want) {
			t.Errorf("got %d %s (%v), want 400 saying %q", status, body, err, want)
		}
	})
}
