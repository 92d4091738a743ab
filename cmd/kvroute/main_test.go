package main

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/scoring"
)

func TestRun(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		wantCode   int
		wantStdout string
		wantStderr string
	}{
		{"no command", nil, 2, "", "Usage:"},
		{"help", []string{"help"}, 0, "kvroute serve", ""},
		{"unknown command", []string{"route"}, 2, "", `unknown command "route"`},
		{"version", []string{"version"}, 0, "kvroute ", ""},
		{"serve help", []string{"serve", "-h"}, 0, "", "KVROUTE_OVERLAP_CREDIT"},
		{"serve bad flag", []string{"serve", "--nope"}, 2, "", "flag provided but not defined"},
		{"serve bad policy", []string{"serve", "--policy", "fastest"}, 2, "", "unknown policy"},
		{"serve stray argument", []string{"serve", "now"}, 2, "", "unexpected arguments"},
		{"serve bad weight", []string{"serve", "--host-weight", "2"}, 2, "", "host_weight"},
		{"serve bad log level", []string{"serve", "--log-level", "loud"}, 2, "", "--log-level"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			code := run(context.Background(), tt.args, &stdout, &stderr)
			if code != tt.wantCode {
				t.Errorf("exit code %d, want %d; stderr %s", code, tt.wantCode, stderr.String())
			}
			if !strings.Contains(stdout.String(), tt.wantStdout) {
				t.Errorf("stdout %q lacks %q", stdout.String(), tt.wantStdout)
			}
			if !strings.Contains(stderr.String(), tt.wantStderr) {
				t.Errorf("stderr %q lacks %q", stderr.String(), tt.wantStderr)
			}
		})
	}
}

func TestParseServe(t *testing.T) {
	env := func(kv ...string) func(string) string {
		m := map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return func(k string) string { return m[k] }
	}

	t.Run("defaults", func(t *testing.T) {
		cfg, lc, err := parseServe(nil, env(), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Listen != ":8080" || cfg.Redis.URL != "" || cfg.Router.BlockSize != 16 || cfg.Router.Scoring.Policy != scoring.PolicyKV || lc.level != "info" {
			t.Errorf("defaults: %+v %+v", cfg, lc)
		}
		if cfg.Router.LeaseTTL != 30*time.Second || cfg.Router.Scoring.HostWeight != 0.75 {
			t.Errorf("router defaults lost: %+v", cfg.Router)
		}
	})
	t.Run("environment", func(t *testing.T) {
		cfg, lc, err := parseServe(nil, env(
			"KVROUTE_LISTEN", "127.0.0.1:9000", "KVROUTE_REDIS_URL", "redis://r:6379",
			"KVROUTE_POLICY", "hard-switch", "KVROUTE_OVERLAP_CREDIT", "0.5",
			"KVROUTE_CREDIT_DECAY", "1", "KVROUTE_PREFILL_LOAD_SCALE", "2",
			"KVROUTE_DECODE_REQUEST_WEIGHT", "3", "KVROUTE_HOST_WEIGHT", "0.5",
			"KVROUTE_BLOCK_SIZE", "32", "KVROUTE_LEASE_TTL", "1m",
			"KVROUTE_REPLICAS_FILE", "/r.json", "KVROUTE_SEED", "7", "KVROUTE_LOG_LEVEL", "debug",
		), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		sc := cfg.Router.Scoring
		if cfg.Listen != "127.0.0.1:9000" || cfg.Redis.URL != "redis://r:6379" || sc.Policy != scoring.PolicyHardSwitch ||
			sc.OverlapCredit != 0.5 || sc.CreditDecay != 1 || sc.PrefillLoadScale != 2 || sc.DecodeRequestWeight != 3 || sc.HostWeight != 0.5 ||
			cfg.Router.BlockSize != 32 || cfg.Router.LeaseTTL != time.Minute || cfg.ReplicasFile != "/r.json" || cfg.Router.Seed != 7 || lc.level != "debug" {
			t.Errorf("environment not applied: %+v %+v", cfg, lc)
		}
	})
	t.Run("flag wins over environment", func(t *testing.T) {
		cfg, _, err := parseServe([]string{"--block-size", "64", "--policy=session"}, env("KVROUTE_BLOCK_SIZE", "32", "KVROUTE_POLICY", "kv"), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if cfg.Router.BlockSize != 64 || cfg.Router.Scoring.Policy != scoring.PolicySession {
			t.Errorf("block size %d policy %q, want the flags' 64 session", cfg.Router.BlockSize, cfg.Router.Scoring.Policy)
		}
	})
	for _, tt := range []struct{ name, key, value, want string }{
		{"bad env number", "KVROUTE_BLOCK_SIZE", "big", "KVROUTE_BLOCK_SIZE"},
		{"bad env duration", "KVROUTE_LEASE_TTL", "5", "KVROUTE_LEASE_TTL"},
		{"zero block size", "KVROUTE_BLOCK_SIZE", "0", "--block-size"},
		{"negative credit", "KVROUTE_OVERLAP_CREDIT", "-1", "overlap_credit"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := parseServe(nil, env(tt.key, tt.value), io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one naming %s", err, tt.want)
			}
		})
	}
}

// lockedBuilder is a strings.Builder the command writes while the test
// reads it.
type lockedBuilder struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuilder) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuilder) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestServeRuns starts the real command in embedded mode and stops it the
// way SIGTERM does, through the context.
func TestServeRuns(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	stderr := &lockedBuilder{}
	go func() {
		done <- run(ctx, []string{"serve", "--listen", "127.0.0.1:0", "--log-format", "json"}, io.Discard, stderr)
	}()
	wait.Until(t, "serve to log that it is serving", func() bool { return strings.Contains(stderr.String(), `"msg":"serving"`) })
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("exit code %d, want 0", code)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop")
	}
	if !strings.Contains(stderr.String(), "embedded in-memory Redis") {
		t.Errorf("embedded mode not announced in the log: %s", stderr.String())
	}
}

// TestDemoListensOnLoopback: the try-it mode's admin API is open, so
// unless an address is given it serves this machine only (and so needs
// no admin token); an address given by flag or environment wins.
func TestDemoListensOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		env  map[string]string
		want string
	}{
		{"demo, no address", []string{"--demo-replicas", "3"}, nil, "127.0.0.1:8080"},
		{"demo, address by flag", []string{"--demo-replicas", "3", "--listen", "127.0.0.1:9999"}, nil, "127.0.0.1:9999"},
		{"demo, address by env", []string{"--demo-replicas", "3"}, map[string]string{"KVROUTE_LISTEN": ":7000"}, ":7000"},
		{"no demo", nil, nil, ":8080"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg, _, err := parseServe(tc.args, func(k string) string { return tc.env[k] }, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if cfg.Listen != tc.want {
				t.Errorf("listen = %q, want %q", cfg.Listen, tc.want)
			}
		})
	}
}
