package main

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
)

func TestAdmissionFlags(t *testing.T) {
	defaults := admission.Config{
		Enabled: true, QueueLimit: admission.DefaultQueueLimit, BandLimit: admission.DefaultBandLimit, TenantLimit: 0, // the fair share
		TTL: admission.DefaultTTL, ColdStart: admission.DefaultColdStart, StaleAfter: admission.DefaultStaleAfter,
	}
	with := func(f func(*admission.Config)) admission.Config {
		c := defaults
		f(&c)
		return c
	}
	tests := []struct {
		name    string
		args    []string
		want    admission.Config
		wantErr string
	}{
		{name: "defaults", want: defaults},
		{name: "off", args: []string{"--admission=false"}, want: with(func(c *admission.Config) { c.Enabled = false })},
		{name: "replica limits", args: []string{"--max-requests", "64", "--max-prefill-tokens", "16384", "--max-waiting", "4", "--max-kv-usage", "0.9"},
			want: with(func(c *admission.Config) {
				c.Limits = kvroute.Limits{MaxRequests: 64, MaxPrefillTokens: 16384, MaxWaiting: 4, MaxKVUsage: 0.9}
			})},
		{name: "queue", args: []string{"--max-in-flight", "500", "--queue-limit", "0", "--band-limit", "10", "--tenant-limit", "3", "--queue-ttl", "5s", "--cold-start", "0", "--stale-after", "2s", "--stale-saturated"},
			want: with(func(c *admission.Config) {
				c.MaxInFlight, c.QueueLimit, c.BandLimit, c.TenantLimit = 500, -1, 10, 3
				c.TTL, c.ColdStart, c.StaleAfter, c.StaleSaturated = 5*time.Second, -1, 2*time.Second, true
			})},
		{name: "model limits", args: []string{"--model-limits", "org/m:v1:max_requests=8,max_kv_usage=0.5,max_in_flight=20", "--model-limits", "small:max_prefill_tokens=100,max_waiting=1"},
			want: with(func(c *admission.Config) {
				c.Models = map[string]admission.Model{
					"org/m:v1": {Limits: kvroute.Limits{MaxRequests: 8, MaxKVUsage: 0.5}, MaxInFlight: 20},
					"small":    {Limits: kvroute.Limits{MaxPrefillTokens: 100, MaxWaiting: 1}},
				}
			})},
		{name: "model declared for the cold start", args: []string{"--model-limits", "cold:"},
			want: with(func(c *admission.Config) { c.Models = map[string]admission.Model{"cold": {}} })},
		{name: "negative requests", args: []string{"--max-requests", "-1"}, wantErr: "--max-requests"},
		{name: "kv usage above one", args: []string{"--max-kv-usage", "1.5"}, wantErr: "--max-kv-usage"},
		{name: "negative in flight", args: []string{"--max-in-flight", "-2"}, wantErr: "--max-in-flight"},
		{name: "negative queue limit", args: []string{"--queue-limit", "-1"}, wantErr: "--queue-limit"},
		{name: "negative band limit", args: []string{"--band-limit", "-1"}, wantErr: "--band-limit"},
		{name: "negative tenant limit", args: []string{"--tenant-limit", "-1"}, wantErr: "--tenant-limit"},
		{name: "zero ttl", args: []string{"--queue-ttl", "0s"}, wantErr: "--queue-ttl"},
		{name: "negative cold start", args: []string{"--cold-start", "-1s"}, wantErr: "--cold-start"},
		{name: "zero stale after", args: []string{"--stale-after", "0s"}, wantErr: "--stale-after"},
		{name: "model without settings", args: []string{"--model-limits", "m"}, wantErr: "model-limits"},
		{name: "model unknown key", args: []string{"--model-limits", "m:max_batch=3"}, wantErr: "unknown key"},
		{name: "model bad number", args: []string{"--model-limits", "m:max_requests=x"}, wantErr: "max_requests"},
		{name: "model kv usage", args: []string{"--model-limits", "m:max_kv_usage=2"}, wantErr: "max KV usage"},
		{name: "model twice", args: []string{"--model-limits", "m:max_requests=1", "--model-limits", "m:max_waiting=1"}, wantErr: "twice"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fs := newFlagSet()
			a := addAdmissionFlags(fs)
			err := fs.Parse(tc.args)
			var got admission.Config
			if err == nil {
				got, err = a.config()
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want one naming %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("config = %+v, want %+v", got, tc.want)
			}
		})
	}
	t.Run("help shows the defaults", func(t *testing.T) {
		fs := newFlagSet()
		addAdmissionFlags(fs)
		var b strings.Builder
		fs.SetOutput(&b)
		fs.PrintDefaults()
		for _, want := range []string{"(default 10000)", "(default 5000)", "(default 1m0s)", "(default 5s)", "(default true)"} {
			if !strings.Contains(b.String(), want) {
				t.Errorf("help lacks %q", want)
			}
		}
	})
	t.Run("environment", func(t *testing.T) {
		fs := newFlagSet()
		a := addAdmissionFlags(fs)
		if err := fs.Parse(nil); err != nil {
			t.Fatal(err)
		}
		env := map[string]string{envName("max-requests"): "32", envName("model-limits"): "m:max_in_flight=4"}
		if err := applyEnv(fs, func(k string) string { return env[k] }); err != nil {
			t.Fatal(err)
		}
		c, err := a.config()
		if err != nil {
			t.Fatal(err)
		}
		if got, want := c.Limits.MaxRequests, int64(32); got != want {
			t.Errorf("max requests %d, want %d", got, want)
		}
		if got, want := c.MaxInFlightFor("m"), int64(4); got != want {
			t.Errorf("max in flight for m %d, want %d", got, want)
		}
	})
}
