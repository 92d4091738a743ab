package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/vllmtest"
)

// parseSimReplica turns the command line and environment into a simulated
// replica's configuration. Its defaults are vLLM's usual ports: 8000 for
// HTTP, 5557 for events and 5558 for replays, bound on every interface,
// as a container's are.
func parseSimReplica(args []string, getenv func(string) string, stderr io.Writer) (app.SimReplicaConfig, logConfig, error) {
	fs := flag.NewFlagSet("sim-replica", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var c app.SimReplicaConfig
	var lc logConfig
	fs.StringVar(&c.Model, "model", app.DemoModel, "`model` name the replica serves")
	fs.StringVar(&c.Listen, "listen", ":8000", "HTTP `address` of its OpenAI API, /health, /metrics and /tokenize")
	fs.StringVar(&c.Events, "events", "tcp://*:5557", "ZeroMQ `endpoint` its PUB socket binds for KV cache events")
	fs.StringVar(&c.Replay, "replay", "tcp://*:5558", "ZeroMQ `endpoint` its replay socket binds")
	fs.StringVar(&c.Topic, "topic", "", "`topic` of its event messages (default: vLLM's, empty)")
	fs.IntVar(&c.BlockSize, "block-size", 16, "tokens per KV block; must match kvroute's --block-size")
	fs.IntVar(&c.CapacityBlocks, "capacity-blocks", 4096, "blocks its prefix cache holds before it evicts (LRU)")
	fs.Float64Var(&c.PrefillTokensPerSec, "prefill-tokens-per-sec", 20000, "simulated prefill speed, in uncached prompt tokens a second (0: instantaneous)")
	fs.Float64Var(&c.DecodeTokensPerSec, "decode-tokens-per-sec", 200, "simulated decode speed, in output tokens a second (0: instantaneous)")
	fs.IntVar(&c.DataParallelSize, "data-parallel-size", 1, "data-parallel engines behind the one HTTP port, as vLLM's: engine r's events and replay ports are --events' and --replay's plus r")
	fs.BoolVar(&c.IgnoreDataParallelRank, "ignore-data-parallel-rank", false, "round-robin requests over the engines whatever their X-data-parallel-rank header says (a vLLM without the header)")
	fs.IntVar(&c.MaxNumSeqs, "max-num-seqs", 0, "requests it runs at once, as vLLM's --max-num-seqs; the rest wait, counted in vllm:num_requests_waiting (0: unbounded)")
	fs.StringVar(&c.SchedulingPolicy, "scheduling-policy", vllmtest.PolicyFCFS, "`policy` ordering its waiting requests, as vLLM's: fcfs (arrival order; a request with a non-zero priority gets 400) or priority ((priority, arrival) order, lowest first)")
	fs.StringVar(&lc.level, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&lc.format, "log-format", "text", "log `format`: text or json")
	fs.Usage = flagUsage(fs, stderr, "sim-replica", "Runs one simulated vLLM replica (no model, no GPU): the OpenAI API, KV cache events over ZeroMQ\nwith a replay socket, and Qwen3's tokenizer and chat template. For local fleets and trials; register it\nwith kvroute serve like any replica.\n")
	if err := fs.Parse(args); err != nil {
		return c, lc, err
	}
	if err := applyEnv(fs, getenv); err != nil {
		return c, lc, err
	}
	switch {
	case fs.NArg() > 0:
		return c, lc, fmt.Errorf("unexpected arguments: %q", fs.Args())
	case c.Model == "":
		return c, lc, errors.New("--model must not be empty")
	case c.Listen == "" || c.Events == "" || c.Replay == "":
		return c, lc, errors.New("--listen, --events and --replay must not be empty")
	case c.BlockSize <= 0:
		return c, lc, fmt.Errorf("--block-size must be positive, got %d", c.BlockSize)
	case c.CapacityBlocks <= 0:
		return c, lc, fmt.Errorf("--capacity-blocks must be positive, got %d", c.CapacityBlocks)
	case c.DataParallelSize < 1 || c.DataParallelSize > kvroute.MaxDataParallelSize:
		return c, lc, fmt.Errorf("--data-parallel-size must be in 1..%d, got %d", kvroute.MaxDataParallelSize, c.DataParallelSize)
	case c.MaxNumSeqs < 0:
		return c, lc, fmt.Errorf("--max-num-seqs must be 0 or more, got %d", c.MaxNumSeqs)
	case c.SchedulingPolicy != vllmtest.PolicyFCFS && c.SchedulingPolicy != vllmtest.PolicyPriority:
		return c, lc, fmt.Errorf("--scheduling-policy must be fcfs or priority, got %q", c.SchedulingPolicy)
	case !(c.PrefillTokensPerSec >= 0) || !(c.DecodeTokensPerSec >= 0):
		return c, lc, errors.New("--prefill-tokens-per-sec and --decode-tokens-per-sec must be 0 or more")
	}
	return c, lc, nil
}

// runSimReplica is `kvroute sim-replica`. It only parses; internal/app runs
// the replica.
func runSimReplica(ctx context.Context, args []string, _, stderr io.Writer) error {
	c, lc, err := parseSimReplica(args, os.Getenv, stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	log, err := newLogger(stderr, lc)
	if err != nil {
		return usageError{err}
	}
	c.Logger = log
	return app.RunSimReplica(ctx, c)
}
