package main

import (
	"context"
	"flag"
	"github.com/kvroute/kvroute/internal/app"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDiscoverFlags(t *testing.T) {
	parse := func(t *testing.T, args ...string) *discoverFlags {
		t.Helper()
		fs := flag.NewFlagSet("x", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		var d discoverFlags
		d.register(fs)
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		return &d
	}
	t.Run("defaults are vLLM's", func(t *testing.T) {
		d := parse(t)
		if d.enabled() || d.httpPort != 8000 || d.eventsPort != 5557 || d.replayPort != 5558 || d.interval != 5*time.Second || d.grace != 30*time.Second {
			t.Errorf("got %+v", *d)
		}
	})
	t.Run("repeatable names, one source each", func(t *testing.T) {
		d := parse(t, "--discover-dns", "vllm.default.svc", "--discover-dns", "_http._tcp.other,third.svc", "--discover-dns-server", "10.0.0.10:53")
		c, err := d.config(nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := sourceNames(c), "dns:vllm.default.svc dns:_http._tcp.other dns:third.svc"; got != want {
			t.Errorf("sources: got %q, want %q", got, want)
		}
	})
	t.Run("kubernetes sources", func(t *testing.T) {
		// A kubeconfig naming a server nobody runs: building a source makes
		// no API call, so the flags are checked without a cluster.
		kc := filepath.Join(t.TempDir(), "kubeconfig")
		const cfg = "apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n" +
			"users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\ncurrent-context: x\n"
		if err := os.WriteFile(kc, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		d := parse(t, "--discover-k8s-service", "default/vllm", "--discover-k8s-selector", "ml/app.kubernetes.io/name=vllm", "--kubeconfig", kc)
		if !d.enabled() {
			t.Fatal("enabled() = false with Kubernetes sources")
		}
		c, err := d.config(nil)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := sourceNames(c), "k8s:default/vllm k8s:ml/app.kubernetes.io/name=vllm"; got != want {
			t.Errorf("sources: got %q, want %q", got, want)
		}
		if _, err := parse(t, "--discover-k8s-service", "vllm", "--kubeconfig", kc).config(nil); err == nil || !strings.Contains(err.Error(), "--discover-k8s-service") {
			t.Errorf("a service without a namespace: err = %v, want one naming the flag", err)
		}
	})
	for _, tc := range []struct {
		name    string
		args    []string
		wantErr string
	}{
		{"bad port", []string{"--discover-dns", "vllm.svc", "--discover-http-port", "0"}, "HTTP port"},
		{"bad events port", []string{"--discover-dns", "vllm.svc", "--discover-events-port", "70000"}, "events or replay port"},
		{"no grace", []string{"--discover-dns", "vllm.svc", "--discover-grace", "0s"}, "--discover-grace"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := parse(t, tc.args...).config(nil); err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("err = %v, want one mentioning %q", err, tc.wantErr)
			}
		})
	}
}

// With Redis, serve runs no ingestor, so discovery flags belong on
// kvroute ingest: serve refuses them rather than ignore them.
func TestServeRefusesDiscoveryWithRedis(t *testing.T) {
	err := runServe(context.Background(), []string{"--listen", "127.0.0.1:0", "--redis-url", "redis://127.0.0.1:1", "--discover-dns", "vllm.svc"}, io.Discard, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "kvroute ingest") {
		t.Errorf("err = %v, want one sending the flags to kvroute ingest", err)
	}
}

// sourceNames lists the names of the sources c follows, in order.
func sourceNames(c app.DiscoverConfig) string {
	var names []string
	for _, s := range c.Sources {
		names = append(names, s.Name())
	}
	return strings.Join(names, " ")
}
