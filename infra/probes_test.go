package infra_test

import (
	"net/http"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/redistest"
)

// TestProbePathsAnswer runs the three commands and checks that every path the
// manifests may probe or scrape (servedPaths, which the manifest checks
// hold them to) answers 200 on the real binary.
func TestProbePathsAnswer(t *testing.T) {
	redisURL := redistest.Server(t)
	t.Run("serve", func(t *testing.T) {
		addr := freeAddr(t)
		p := startProc(t, "serve", "--listen", addr, "--redis-url", redisURL)
		checkPaths(t, p, "http://"+addr, servedPaths["serve"])
	})
	t.Run("ingest", func(t *testing.T) {
		addr := freeAddr(t)
		p := startProc(t, "ingest", "--metrics-listen", addr, "--redis-url", redisURL, "--owner", "infra-test")
		checkPaths(t, p, "http://"+addr, servedPaths["ingest"])
	})
	t.Run("sim-replica", func(t *testing.T) {
		addr := freeAddr(t)
		p := startProc(t, "sim-replica", "--listen", addr, "--events", "tcp://"+freeAddr(t), "--replay", "tcp://"+freeAddr(t))
		checkPaths(t, p, "http://"+addr, servedPaths["sim-replica"])
	})
}

func checkPaths(t *testing.T, p *proc, base string, paths []string) {
	t.Helper()
	waitHTTP(t, p, base+paths[0], 30*time.Second) // the liveness path, first
	for _, path := range paths {
		code, body, err := call(t.Context(), http.MethodGet, base+path, "")
		if err != nil {
			t.Errorf("GET %s: %v", path, err)
			continue
		}
		if code != http.StatusOK {
			t.Errorf("GET %s: got %d %s, want 200", path, code, body)
		}
	}
}
