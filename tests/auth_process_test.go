package tests_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/wait"
)

// TestAdminAuthProcess is the finding against `kvroute serve` as a process:
// with an admin token configured, DELETE, a PUT that redirects a replica's
// traffic and one that takes it out of routing answer 401 without it (and
// change nothing), and work with it; a replicas file naming the metadata
// service fails the start.
func TestAdminAuthProcess(t *testing.T) {
	const token = "admin-token-0123456789"
	dir := t.TempDir()
	file := filepath.Join(dir, "admin-token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	p := startServe(t, "--admin-token-file", file, "--demo-replicas", "1")
	call := func(method, path, body, tok string) (int, http.Header, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, method, p.base+path, strings.NewReader(body))
		if tok != "" {
			req.Header.Set("Authorization", "Bearer "+tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b := new(strings.Builder)
		_, _ = io.Copy(b, resp.Body)
		return resp.StatusCode, resp.Header, b.String()
	}
	wait.Until(t, "demo-0 registered", func() bool {
		status, _, _ := call(http.MethodGet, "/v1/replicas/demo-0", "", token)
		return status == http.StatusOK
	})
	// The registry as ids and URLs (health and its time change by
	// themselves, as the ingestor probes).
	registry := func() string {
		_, _, raw := call(http.MethodGet, "/v1/replicas", "", token)
		var list struct {
			Replicas []struct{ ID, URL string }
		}
		if err := json.Unmarshal([]byte(raw), &list); err != nil {
			t.Fatalf("%v: %s", err, raw)
		}
		return fmt.Sprint(list.Replicas)
	}
	before := registry()
	for _, a := range []struct{ method, path, body string }{
		{http.MethodDelete, "/v1/replicas/demo-0", ""},
		{http.MethodPut, "/v1/replicas/demo-0", `{"model":"demo","url":"http://attacker.example:80"}`},
		{http.MethodPut, "/v1/replicas/demo-0", `{"model":"demo","url":"http://127.0.0.1:1","health":"unhealthy"}`},
		{http.MethodGet, "/v1/replicas/demo-0", ""},
	} {
		status, hdr, raw := call(a.method, a.path, a.body, "")
		if status != http.StatusUnauthorized || hdr.Get("WWW-Authenticate") != `Bearer realm="kvroute"` || !strings.Contains(raw, `"unauthorized"`) {
			t.Errorf("%s %s without a token: %d %v %s", a.method, a.path, status, hdr.Get("WWW-Authenticate"), raw)
		}
	}
	if after := registry(); after != before {
		t.Errorf("registry changed:\n%s\n%s", before, after)
	}
	if strings.Contains(p.log(), token) {
		t.Error("the token is in the logs")
	}
	if status, _, raw := call(http.MethodGet, "/v1/replicas/demo-0", "", token); status != http.StatusOK {
		t.Errorf("with the token: %d %s", status, raw)
	}
	if status, _, raw := call(http.MethodGet, "/metrics", "", ""); status != http.StatusOK {
		t.Errorf("metrics stay open: %d %.200s", status, raw)
	}
}
