package main

import (
	"io"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/api"
)

func TestParseServeAccessLog(t *testing.T) {
	for _, tt := range []struct {
		name      string
		args      []string
		env       map[string]string
		wantMode  api.AccessLogMode
		wantEvery int
		wantErr   string
	}{
		{name: "default", wantMode: api.AccessLogSampled, wantEvery: api.DefaultAccessLogEvery},
		{name: "flag", args: []string{"--access-log", "errors"}, wantMode: api.AccessLogErrors, wantEvery: api.DefaultAccessLogEvery},
		{name: "environment", env: map[string]string{"KVROUTE_ACCESS_LOG": "all", "KVROUTE_ACCESS_LOG_EVERY": "7"}, wantMode: api.AccessLogAll, wantEvery: 7},
		{name: "unknown mode", args: []string{"--access-log", "loud"}, wantErr: "access-log"},
		{name: "zero sample", args: []string{"--access-log-every", "0"}, wantErr: "access-log-every"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			getenv := func(k string) string { return tt.env[k] }
			cfg, _, err := parseServe(tt.args, getenv, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("got error %v, want one naming %s", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if cfg.AccessLog != tt.wantMode || cfg.AccessLogEvery != tt.wantEvery {
				t.Errorf("got access log %q every %d, want %q every %d", cfg.AccessLog, cfg.AccessLogEvery, tt.wantMode, tt.wantEvery)
			}
		})
	}
}
