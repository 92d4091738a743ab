package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
)

func TestParseIngest(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		check   func(t *testing.T, c ingestConfig)
	}{
		{name: "redis url required", wantErr: "--redis-url"},
		{name: "from env", env: map[string]string{"KVROUTE_REDIS_URL": "redis://r:6379", "KVROUTE_SEED": "7", "KVROUTE_LEASE_TTL": "3s"},
			check: func(t *testing.T, c ingestConfig) {
				if c.redis.URL != "redis://r:6379" || c.ing.Seed != 7 || c.ing.LeaseTTL != 3*time.Second {
					t.Errorf("got url %q seed %d ttl %v", c.redis.URL, c.ing.Seed, c.ing.LeaseTTL)
				}
			}},
		{name: "flag wins over env", args: []string{"--redis-url", "redis://flag:1", "--bind", "tcp://*:5557"}, env: map[string]string{"KVROUTE_REDIS_URL": "redis://env:1"},
			check: func(t *testing.T, c ingestConfig) {
				if c.redis.URL != "redis://flag:1" || c.ing.Bind != "tcp://*:5557" {
					t.Errorf("got url %q bind %q", c.redis.URL, c.ing.Bind)
				}
			}},
		{name: "replica cidrs from env", env: map[string]string{"KVROUTE_REDIS_URL": "redis://r:6379", "KVROUTE_ALLOW_REPLICA_CIDRS": "169.254.0.0/16"},
			check: func(t *testing.T, c ingestConfig) {
				if len(c.allowCIDRs) != 1 || c.allowCIDRs[0].String() != "169.254.0.0/16" {
					t.Errorf("got allowed %v, want [169.254.0.0/16]", c.allowCIDRs)
				}
			}},
		{name: "bad duration", args: []string{"--redis-url", "redis://x:1", "--purge-grace", "soon"}, wantErr: "purge-grace"},
		{name: "stray argument", args: []string{"--redis-url", "redis://x:1", "now"}, wantErr: "unexpected arguments"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseIngest(tt.args, env(tt.env), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c)
		})
	}
}

// TestIngestRuns starts `kvroute ingest` against a real redis-server,
// scrapes its /metrics and stops it with the context, as SIGTERM would.
func TestIngestRuns(t *testing.T) {
	url := redistest.Server(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	go func() {
		done <- run(ctx, []string{"ingest", "--redis-url", url, "--metrics-listen", addr, "--owner", "test"}, io.Discard, io.Discard)
	}()
	var b []byte
	wait.UntilNil(t, "the metrics endpoint", func() error {
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, err = io.ReadAll(resp.Body)
		return err
	})
	if !strings.Contains(string(b), "kvroute_ingest_") {
		t.Errorf("/metrics lacks the ingestor's series")
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit code %d, want 0", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ingest did not stop on cancel")
	}
}
