package main

import (
	"io"
	"strings"
	"testing"
)

func TestParseSimReplica(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		wantErr string
		check   func(t *testing.T, listen, events, replay, model string, bs int)
	}{
		{name: "vLLM's ports by default", check: func(t *testing.T, listen, events, replay, model string, bs int) {
			if listen != ":8000" || events != "tcp://*:5557" || replay != "tcp://*:5558" || model != "demo" || bs != 16 {
				t.Errorf("got %s %s %s %s %d; want :8000 tcp://*:5557 tcp://*:5558 demo 16", listen, events, replay, model, bs)
			}
		}},
		{name: "from env, the flag winning", args: []string{"--model", "flag"}, env: map[string]string{"KVROUTE_MODEL": "env", "KVROUTE_BLOCK_SIZE": "32"},
			check: func(t *testing.T, _, _, _, model string, bs int) {
				if model != "flag" || bs != 32 {
					t.Errorf("got model %q block size %d, want flag and 32", model, bs)
				}
			}},
		{name: "empty model", args: []string{"--model", ""}, wantErr: "--model"},
		{name: "block size", args: []string{"--block-size", "0"}, wantErr: "--block-size"},
		{name: "capacity", args: []string{"--capacity-blocks", "-1"}, wantErr: "--capacity-blocks"},
		{name: "speed", args: []string{"--decode-tokens-per-sec", "-5"}, wantErr: "tokens-per-sec"},
		{name: "not a number", args: []string{"--prefill-tokens-per-sec", "fast"}, wantErr: "prefill-tokens-per-sec"},
		{name: "stray argument", args: []string{"now"}, wantErr: "unexpected arguments"},
		{name: "no engines", args: []string{"--data-parallel-size", "0"}, wantErr: "--data-parallel-size"},
		{name: "too many engines", args: []string{"--data-parallel-size", "65"}, wantErr: "--data-parallel-size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := parseSimReplica(tt.args, env(tt.env), io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tt.check(t, c.Listen, c.Events, c.Replay, c.Model, c.BlockSize)
		})
	}
}

func TestParseSimReplicaDataParallel(t *testing.T) {
	c, _, err := parseSimReplica([]string{"--data-parallel-size", "4", "--ignore-data-parallel-rank"}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.DataParallelSize != 4 || !c.IgnoreDataParallelRank {
		t.Errorf("got size %d ignore %v, want 4 and true", c.DataParallelSize, c.IgnoreDataParallelRank)
	}
	c, _, err = parseSimReplica(nil, func(string) string { return "" }, io.Discard)
	if err != nil || c.DataParallelSize != 1 || c.IgnoreDataParallelRank {
		t.Errorf("default: size %d ignore %v (%v), want one engine honouring the header", c.DataParallelSize, c.IgnoreDataParallelRank, err)
	}
}

// TestParseSimReplicaScheduler: --max-num-seqs and --scheduling-policy
// reach the replica's configuration, from flags or the environment, with
// vLLM's default policy, and bad values name their flag.
func TestParseSimReplicaScheduler(t *testing.T) {
	tests := []struct {
		name       string
		args       []string
		env        map[string]string
		wantSeqs   int
		wantPolicy string
		wantErr    string
	}{
		{name: "unbounded fcfs by default", wantPolicy: "fcfs"},
		{name: "flags", args: []string{"--max-num-seqs", "8", "--scheduling-policy", "priority"}, wantSeqs: 8, wantPolicy: "priority"},
		{name: "env", env: map[string]string{"KVROUTE_MAX_NUM_SEQS": "2", "KVROUTE_SCHEDULING_POLICY": "priority"}, wantSeqs: 2, wantPolicy: "priority"},
		{name: "negative", args: []string{"--max-num-seqs", "-1"}, wantErr: "--max-num-seqs"},
		{name: "unknown policy", args: []string{"--scheduling-policy", "lifo"}, wantErr: "--scheduling-policy"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, _, err := parseSimReplica(tt.args, func(k string) string { return tt.env[k] }, io.Discard)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err = %v, want one mentioning %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.MaxNumSeqs != tt.wantSeqs || c.SchedulingPolicy != tt.wantPolicy {
				t.Errorf("got max-num-seqs %d policy %q, want %d and %q", c.MaxNumSeqs, c.SchedulingPolicy, tt.wantSeqs, tt.wantPolicy)
			}
		})
	}
}
