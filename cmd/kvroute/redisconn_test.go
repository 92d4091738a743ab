package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/redistest"
)

// serveAndAnswer runs a kvroute command line until url answers 200, then
// stops it as SIGTERM would and wants exit code 0: the command reached
// its Redis with the settings given (serve's /readyz and ingest's /healthz
// need the store to answer at start).
func serveAndAnswer(t *testing.T, url string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, io.Discard, io.Discard) }()
	deadline := time.Now().Add(15 * time.Second)
	for {
		select {
		case code := <-done:
			t.Fatalf("kvroute %s exited with %d before %s answered", args[0], code, url)
		default:
		}
		resp, err := http.Get(url)
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never answered 200 (last %v)", url, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("kvroute %s exit code %d, want 0", args[0], code)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("kvroute %s did not stop", args[0])
	}
}

func freeListen(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestRedisSettings runs serve and ingest against real servers that
// require TLS client certificates or an ACL user, set by flags for one
// command and by environment variables for the other: both commands take
// the same settings.
func TestRedisSettings(t *testing.T) {
	t.Run("TLS with a client certificate", func(t *testing.T) {
		addr, f := redistest.TLSServer(t)
		listen := freeListen(t)
		serveAndAnswer(t, "http://"+listen+"/readyz", "serve", "--listen", listen, "--redis-url", "rediss://"+addr,
			"--redis-tls-ca", f.CA, "--redis-tls-cert", f.ClientCert, "--redis-tls-key", f.ClientKey)
		t.Setenv("KVROUTE_REDIS_URL", "rediss://"+addr)
		t.Setenv("KVROUTE_REDIS_TLS_CA", f.CA)
		t.Setenv("KVROUTE_REDIS_TLS_CERT", f.ClientCert)
		t.Setenv("KVROUTE_REDIS_TLS_KEY", f.ClientKey)
		metrics := freeListen(t)
		serveAndAnswer(t, "http://"+metrics+"/healthz", "ingest", "--metrics-listen", metrics, "--owner", "tls")
	})
	t.Run("ACL user, password from a file or the environment", func(t *testing.T) {
		addr := redistest.ACLServer(t, "kvroute", "s3cret")
		file := filepath.Join(t.TempDir(), "password")
		if err := os.WriteFile(file, []byte("s3cret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		listen := freeListen(t)
		serveAndAnswer(t, "http://"+listen+"/readyz", "serve", "--listen", listen, "--redis-url", "redis://"+addr,
			"--redis-username", "kvroute", "--redis-password-file", file)
		t.Setenv("KVROUTE_REDIS_URL", "redis://"+addr)
		t.Setenv("KVROUTE_REDIS_USERNAME", "kvroute")
		t.Setenv("KVROUTE_REDIS_PASSWORD", "s3cret")
		metrics := freeListen(t)
		serveAndAnswer(t, "http://"+metrics+"/healthz", "ingest", "--metrics-listen", metrics, "--owner", "acl")
	})
	t.Run("a wrong password fails the start", func(t *testing.T) {
		addr := redistest.ACLServer(t, "kvroute", "s3cret")
		code := run(context.Background(), []string{"ingest", "--redis-url", "redis://" + addr, "--redis-username", "kvroute",
			"--redis-password", "wrong", "--metrics-listen", freeListen(t)}, io.Discard, io.Discard)
		if code != 1 {
			t.Errorf("exit code %d, want 1", code)
		}
	})
}
