package main

import (
	"io"
	"strings"
	"testing"
	"time"
)

// TestProxyBoundFlags: --proxy-header-timeout and --proxy-response-factor
// reach the app, from flags or the environment; 0 turns the bound off.
func TestProxyBoundFlags(t *testing.T) {
	for _, tt := range []struct {
		name       string
		args       []string
		env        map[string]string
		wantBound  time.Duration
		wantFactor float64
	}{
		{"defaults", nil, nil, 5 * time.Second, 3},
		{"flags", []string{"--proxy-header-timeout", "2s", "--proxy-response-factor", "1.5"}, nil, 2 * time.Second, 1.5},
		{"environment", nil, map[string]string{"KVROUTE_PROXY_HEADER_TIMEOUT": "750ms"}, 750 * time.Millisecond, 3},
		{"zero is off", []string{"--proxy-header-timeout", "0"}, nil, -1, 3},
	} {
		t.Run(tt.name, func(t *testing.T) {
			cfg, lc, err := parseServe(tt.args, func(k string) string { return tt.env[k] }, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			if err := lc.access.apply(&cfg); err != nil {
				t.Fatal(err)
			}
			if cfg.ProxyHeaderTimeout != tt.wantBound || cfg.ProxyResponseFactor != tt.wantFactor {
				t.Errorf("got %v and %v, want %v and %v", cfg.ProxyHeaderTimeout, cfg.ProxyResponseFactor, tt.wantBound, tt.wantFactor)
			}
		})
	}
	for _, tt := range []struct{ name, flag, value string }{
		{"negative timeout", "--proxy-header-timeout", "-1s"},
		{"factor below one", "--proxy-response-factor", "0.5"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := parseServe([]string{tt.flag, tt.value}, func(string) string { return "" }, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.flag) {
				t.Errorf("got %v, want an error naming %s", err, tt.flag)
			}
		})
	}
}
