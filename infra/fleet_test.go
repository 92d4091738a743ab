package infra_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
)

// TestLocalFleet runs compose.yaml's fleet as the processes its services
// run, without a container runtime: a real redis-server, two `kvroute
// sim-replica`, `kvroute serve` registering them from a replicas file
// (written here like compose's, with loopback addresses for the service
// names; TestCompose checks compose's own against its services) and two
// `kvroute ingest` sharing them by leases. A chat sent twice through the
// proxy (compose.yaml's own example, read from its comments) must come
// back to the replica that cached it, with the blocks the ingestors
// indexed from its events, and the replica must report those tokens
// cached.
func TestLocalFleet(t *testing.T) {
	kvrouteBinary(t) // built before the clock starts (see newWarmFleet)
	redisURL := redistest.Server(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()

	var reps []map[string]any
	for i := range 2 {
		httpAddr := freeAddr(t)
		events, replay := "tcp://"+freeAddr(t), "tcp://"+freeAddr(t)
		p := startProc(t, "sim-replica", "--listen", httpAddr, "--events", events, "--replay", replay, "--log-format", "json")
		waitHTTP(t, p, "http://"+httpAddr+"/health", 30*time.Second)
		reps = append(reps, map[string]any{"id": fmt.Sprintf("sim-%d", i), "model": "demo",
			"url": "http://" + httpAddr, "events": events, "replay": replay})
	}
	raw, _ := json.Marshal(reps)
	file := filepath.Join(t.TempDir(), "replicas.json")
	if err := os.WriteFile(file, raw, 0o600); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		startProc(t, "ingest", "--redis-url", redisURL, "--owner", fmt.Sprintf("fleet-ingest-%d", i),
			"--metrics-listen", freeAddr(t), "--health-interval", "200ms", "--metrics-interval", "200ms")
	}
	addr := freeAddr(t)
	base := "http://" + addr
	serve := startProc(t, "serve", "--listen", addr, "--redis-url", redisURL, "--replicas-file", file)
	waitHTTP(t, serve, base+"/readyz", 30*time.Second)

	chat := composeExample(t)
	send := func() (replica string, matched int, cached int) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(chat))
		req.Header.Set("Content-Type", "application/json")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("chat completion: %d, %v", resp.StatusCode, err)
		}
		m, err := strconv.Atoi(resp.Header.Get("X-Kvroute-Matched-Blocks"))
		if err != nil {
			t.Fatalf("X-Kvroute-Matched-Blocks %q: %v", resp.Header.Get("X-Kvroute-Matched-Blocks"), err)
		}
		return resp.Header.Get("X-Kvroute-Replica"), m, out.Usage.Details.Cached
	}
	first, _, _ := send()
	if first == "" {
		t.Fatal("the proxy named no replica")
	}
	// The ingestors index the first chat's blocks from the replica's
	// events within a moment; until then a repeat may land anywhere.
	var replica string
	var matched, cached int
	wait.UntilNil(t, "a cache-aware repeat", func() error {
		if replica, matched, cached = send(); replica != first || matched == 0 || cached == 0 {
			return fmt.Errorf("repeat went to %s with %d matched blocks and %d cached tokens; want %s, cache-aware", replica, matched, cached, first)
		}
		return nil
	})
	if cached/16 != matched {
		t.Errorf("the replica served %d cached tokens (%d blocks of 16); the router promised %d blocks", cached, cached/16, matched)
	}
	t.Logf("repeat routed to %s: %d matched blocks, %d tokens cached on the replica", replica, matched, cached)
}

var composeCurl = regexp.MustCompile(`(?m)^#\s+curl -si localhost:8080/v1/chat/completions -d '(\{.*\})'$`)

// composeExample is the chat compose.yaml's comments tell a user to send.
func composeExample(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := composeCurl.FindSubmatch(b)
	if m == nil {
		t.Fatal("compose.yaml's comments show no chat completion to send")
	}
	if !json.Valid(m[1]) {
		t.Fatalf("compose.yaml's example is not JSON: %s", m[1])
	}
	return string(m[1])
}
