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
