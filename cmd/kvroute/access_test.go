package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestAccessFlags(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "admin")
	if err := os.WriteFile(file, []byte("# rotated\nadmin-token-0123456789\n\nadmin-token-abcdefghij\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	noenv := func(string) string { return "" }
	t.Run("defaults", func(t *testing.T) {
		cfg, lc, err := parseServe(nil, noenv, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if lc.access.maxOutputTokens != 131072 || cfg.Router.MaxLease != time.Hour || len(lc.access.access.AdminTokens) != 0 {
			t.Errorf("defaults: %+v, max lease %v", lc.access, cfg.Router.MaxLease)
		}
	})
	t.Run("files, environment and flags", func(t *testing.T) {
		env := map[string]string{"KVROUTE_API_TOKENS": "api-token-0123456789ab,api-token-0123456789cd", "KVROUTE_MAX_LEASE": "10m"}
		cfg, lc, err := parseServe([]string{"--admin-token-file", file, "--metrics-auth", "--allow-replica-cidrs", "169.254.0.0/16,fe80::1"},
			func(k string) string { return env[k] }, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		a := lc.access
		if len(a.access.AdminTokens) != 2 || len(a.access.APITokens) != 2 || !a.access.MetricsAuth || cfg.Router.MaxLease != 10*time.Minute {
			t.Errorf("got %+v, max lease %v", a.access, cfg.Router.MaxLease)
		}
		if got := a.policy.Allow; len(got) != 2 || got[0].String() != "169.254.0.0/16" || got[1].String() != "fe80::1/128" {
			t.Errorf("allow = %v", got)
		}
	})
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"short token", []string{"--admin-token", "secret"}, "shorter than 16"},
		{"missing file", []string{"--admin-token-file", filepath.Join(dir, "nope")}, "--admin-token-file"},
		{"metrics auth without admin token", []string{"--metrics-auth"}, "needs an admin token"},
		{"bad prefix", []string{"--allow-replica-cidrs", "10.0.0.0/99"}, "not a prefix"},
		{"no output tokens", []string{"--max-output-tokens", "0"}, "--max-output-tokens"},
		{"zero lease", []string{"--max-lease", "0s"}, "--max-lease"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, _, err := parseServe(tt.args, noenv, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Errorf("the error quotes the token: %v", err)
			}
		})
	}
}

func TestNamedAPITokens(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "api")
	lines := "# tenants\nteam-a:token-of-team-a-0123\nbare-token-0123456789ab\nteam.b_2:token-of-team-b-0123\nnot a name:token-with-colon-0123\n"
	if err := os.WriteFile(file, []byte(lines), 0o600); err != nil {
		t.Fatal(err)
	}
	noenv := func(string) string { return "" }
	t.Run("names and bare tokens", func(t *testing.T) {
		_, lc, err := parseServe([]string{"--api-token-file", file, "--tenant-header", "X-Tenant"}, noenv, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		a := lc.access.access
		if got, want := fmt.Sprint(a.NamedAPITokens), "[{team-a token-of-team-a-0123} {team.b_2 token-of-team-b-0123}]"; got != want {
			t.Errorf("named = %s, want %s", got, want)
		}
		if got, want := fmt.Sprint(a.APITokens), "[bare-token-0123456789ab not a name:token-with-colon-0123]"; got != want {
			t.Errorf("bare = %s, want %s", got, want)
		}
		if a.TenantHeader != "X-Tenant" {
			t.Errorf("tenant header = %q, want X-Tenant", a.TenantHeader)
		}
	})
	t.Run("default trusts no header", func(t *testing.T) {
		_, lc, err := parseServe(nil, noenv, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if got := lc.access.access.TenantHeader; got != "" {
			t.Errorf("tenant header = %q, want none", got)
		}
	})
	for _, tt := range []struct {
		name, file, want string
		args             []string
	}{
		{"short named token", "team:short-secret\n", "shorter than 16", nil},
		{"bad tenant header", "team:token-of-team-a-0123\n", "--tenant-header", []string{"--tenant-header", "X Tenant"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := filepath.Join(dir, strings.ReplaceAll(tt.name, " ", "-"))
			if err := os.WriteFile(f, []byte(tt.file), 0o600); err != nil {
				t.Fatal(err)
			}
			_, _, err := parseServe(append([]string{"--api-token-file", f}, tt.args...), noenv, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("got %v, want an error containing %q", err, tt.want)
			}
			if err != nil && strings.Contains(err.Error(), "secret") {
				t.Errorf("the error quotes the token: %v", err)
			}
		})
	}
}

// TestServeExposure is the finding: serve listened on every interface with
// an open admin API.
func TestServeExposure(t *testing.T) {
	for _, tt := range []struct {
		listen string
		token  bool
		extra  []string
		ok     bool
	}{
		{":8080", false, nil, false},
		{"0.0.0.0:8080", false, nil, false},
		{"[::]:8080", false, nil, false},
		{"10.0.0.5:8080", false, nil, false},
		{"example.com:8080", false, nil, false},
		{":8080", false, []string{"--insecure-admin"}, true},
		{":8080", true, nil, true},
		{"127.0.0.1:8080", false, nil, true},
		{"[::1]:8080", false, nil, true},
		{"localhost:8080", false, nil, true},
	} {
		t.Run(tt.listen+" "+strings.Join(tt.extra, " "), func(t *testing.T) {
			args := append([]string{"--listen", tt.listen}, tt.extra...)
			if tt.token {
				args = append(args, "--admin-token", "admin-token-0123456789")
			}
			cfg, lc, err := parseServe(args, func(string) string { return "" }, io.Discard)
			if err != nil {
				t.Fatal(err)
			}
			err = lc.access.checkExposure(cfg.Listen)
			if (err == nil) != tt.ok {
				t.Errorf("checkExposure = %v, want ok=%v", err, tt.ok)
			}
		})
	}
	t.Run("serve refuses to start", func(t *testing.T) {
		var stderr strings.Builder
		code := run(context.Background(), []string{"serve", "--listen", "0.0.0.0:0"}, io.Discard, &stderr)
		if code != 2 || !strings.Contains(stderr.String(), "without a token") {
			t.Errorf("exit %d, stderr %q; want 2 and the refusal", code, stderr.String())
		}
	})
}
