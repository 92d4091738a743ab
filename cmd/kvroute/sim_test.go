package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/scoring"
)

// simJSON runs `kvroute sim` with args plus --json and no chart.
func simJSON(t *testing.T, args ...string) simOutput {
	t.Helper()
	var stdout, stderr strings.Builder
	args = append(args, "--json", "--svg", "")
	if err := runSim(context.Background(), args, &stdout, &stderr); err != nil {
		t.Fatalf("sim %v: %v\n%s", args, err, stderr.String())
	}
	var out simOutput
	if err := json.Unmarshal([]byte(stdout.String()), &out); err != nil {
		t.Fatalf("sim %v: bad JSON: %v", args, err)
	}
	return out
}

func TestSim(t *testing.T) {
	t.Run("default decode booking is the service's", func(t *testing.T) {
		// The router books a request's output blocks as decode load; the
		// simulator must default to the same view, or its tables describe
		// a router nobody runs.
		def := simJSON(t, "--workload", "herding", "--policies", "kv")
		out := simJSON(t, "--workload", "herding", "--policies", "kv", "--decode-booking", "output")
		if got, want := def.Reports[0].HitRate, out.Reports[0].HitRate; got != want {
			t.Errorf("default hit rate %v, with --decode-booking output %v", got, want)
		}
		if got, want := def.Reports[0].MakespanS, out.Reports[0].MakespanS; got != want {
			t.Errorf("default makespan %v, with --decode-booking output %v", got, want)
		}
	})
	t.Run("defaults are scoring's", func(t *testing.T) {
		got := simJSON(t, "--workload", "agentic", "--policies", "kv").Reports[0].Weights
		if want := scoring.DefaultConfig(); got != want {
			t.Errorf("weights %+v, want %+v", got, want)
		}
	})
	t.Run("dynamo weights", func(t *testing.T) {
		got := simJSON(t, "--workload", "agentic", "--policies", "kv", "--weights", "dynamo,credit_decay=0.5").Reports[0].Weights
		want := scoring.DynamoConfig()
		want.CreditDecay = 0.5
		if got != want {
			t.Errorf("weights %+v, want %+v", got, want)
		}
	})
	t.Run("decode slowdown reaches the engine", func(t *testing.T) {
		fixed := simJSON(t, "--workload", "agentic", "--policies", "kv")
		slow := simJSON(t, "--workload", "agentic", "--policies", "kv", "--decode-slowdown", "3")
		if got, fast := slow.Reports[0].E2E.P50, fixed.Reports[0].E2E.P50; got <= fast {
			t.Errorf("E2E p50 with --decode-slowdown 3 = %v ms, want more than the fixed rate's %v", got, fast)
		}
	})
	t.Run("table and chart", func(t *testing.T) {
		svg := filepath.Join(t.TempDir(), "sim.svg")
		var stdout, stderr strings.Builder
		if err := runSim(context.Background(), []string{"--workload", "herding", "--replicas", "4", "--svg", svg}, &stdout, &stderr); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"hit%", "TTFT p99 ms", "KV CV 0.5s", "req CV 0.5s", "pure-affinity"} {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("table lacks %q:\n%s", want, stdout.String())
			}
		}
		b, err := os.ReadFile(svg)
		if err != nil || !strings.Contains(string(b), "</svg>") {
			t.Errorf("chart not written: %v", err)
		}
	})
	t.Run("admission flags reach the sim", func(t *testing.T) {
		base := []string{"--trace", "../../sim/testdata/mooncake_head300.jsonl", "--replicas", "2", "--policies", "kv", "--time-scale", "0.2"}
		off := simJSON(t, base...)
		if off.Reports[0].Admission != nil {
			t.Error("admission report without a limit")
		}
		noLimit := simJSON(t, append(base, "--priority-share", "0.2", "--tenants", "a=1,b=1")...)
		if got, want := noLimit.Reports[0].TTFT, off.Reports[0].TTFT; got != want {
			t.Errorf("no limit: TTFT %+v, want %+v as without tags", got, want)
		}
		on := simJSON(t, append(base, "--max-requests", "4", "--priority-share", "0.2", "--tenants", "a=1,b=1")...)
		a := on.Reports[0].Admission
		if a == nil || a.Queued == 0 || len(a.Bands) != 2 || len(a.Tenants) != 2 {
			t.Fatalf("admission report %+v, want queuing, 2 bands, 2 tenants", a)
		}
		if !on.Config.Admission.Enabled || on.Config.Admission.Limits.MaxRequests != 4 {
			t.Errorf("config admission %+v, want enabled with max requests 4", on.Config.Admission)
		}
		var stdout, stderr strings.Builder
		if err := runSim(context.Background(), append(base, "--max-requests", "4", "--svg", ""), &stdout, &stderr); err != nil {
			t.Fatal(err)
		}
		for _, want := range []string{"band 0", "served cost", "admitted"} {
			if !strings.Contains(stdout.String(), want) {
				t.Errorf("text lacks %q:\n%s", want, stdout.String())
			}
		}
	})
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"bad priority share", []string{"--workload", "herding", "--priority-share", "2"}, "--priority-share"},
		{"bad tenants", []string{"--workload", "herding", "--tenants", "a"}, "--tenants"},
		{"bad admission flag", []string{"--workload", "herding", "--max-requests", "-1"}, "--max-requests"},
		{"no workload", nil, "exactly one of"},
		{"both workloads", []string{"--workload", "herding", "--trace", "x.jsonl"}, "exactly one of"},
		{"unknown workload", []string{"--workload", "nope"}, "unknown workload"},
		{"bad booking", []string{"--workload", "herding", "--decode-booking", "both"}, "decode booking"},
		{"bad weight", []string{"--workload", "herding", "--weights", "overlap_credit=-1"}, "overlap_credit"},
		{"bad slowdown", []string{"--workload", "herding", "--decode-slowdown", "-1"}, "decode slowdown"},
		{"missing trace", []string{"--trace", "/nonexistent.jsonl"}, "no such file"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr strings.Builder
			err := runSim(context.Background(), append(tt.args, "--svg", ""), &stdout, &stderr)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("err = %v, want one containing %q", err, tt.want)
			}
		})
	}
}
