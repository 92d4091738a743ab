package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/kvroute/kvroute/vllmtest"
)

// SimReplicaConfig configures RunSimReplica.
type SimReplicaConfig struct {
	// Model is the model the replica serves. Required.
	Model string
	// Listen is the HTTP address of its OpenAI API, /health, /metrics and
	// /tokenize. Required.
	Listen string
	// Events and Replay are the ZeroMQ endpoints it binds: the PUB socket
	// of its KV cache events and the ROUTER socket answering replays, as
	// vLLM's kv-events-config endpoint and replay_endpoint. Required.
	Events, Replay string
	// Topic is the first frame of every event message. Empty is vLLM's
	// default.
	Topic string
	// BlockSize is its tokens per KV block; zero means 16.
	BlockSize int
	// CapacityBlocks bounds its prefix cache (LRU beyond it); zero means
	// 4096 blocks.
	CapacityBlocks int
	// PrefillTokensPerSec and DecodeTokensPerSec set how long a request
	// takes (uncached prompt tokens, then each output token); zero means
	// instantaneous.
	PrefillTokensPerSec, DecodeTokensPerSec float64
	// DataParallelSize runs that many engines behind Listen, as vllm
	// serve --data-parallel-size does: engine r binds Events and Replay
	// with their ports offset by r. Zero or one means one engine.
	DataParallelSize int
	// IgnoreDataParallelRank makes a data-parallel replica round-robin
	// requests whatever their X-data-parallel-rank header says, as a vLLM
	// without the header does. False honours the header.
	IgnoreDataParallelRank bool
	// MaxNumSeqs bounds the requests it runs at once, as vllm serve
	// --max-num-seqs does; the rest wait, counted in
	// vllm:num_requests_waiting, so that a local fleet can be driven past
	// its capacity. Zero means unbounded.
	MaxNumSeqs int
	// SchedulingPolicy orders its waiting requests, as vllm serve
	// --scheduling-policy: vllmtest.PolicyFCFS (arrival order; a request
	// with a non-zero priority is refused with 400) or
	// vllmtest.PolicyPriority ((priority, arrival) order, lowest first).
	// Empty means fcfs, vLLM's default.
	SchedulingPolicy string
	// Logger receives its logs; nil discards them.
	Logger *slog.Logger
}

// RunSimReplica runs one simulated vLLM replica until ctx ends, then lets
// the requests in flight finish (up to 2 s) before it closes its sockets:
// the process behind `kvroute sim-replica`, so that a local fleet
// (compose.yaml) or a staging cluster can run Redis, scoring pods and
// ingestors for real against engines that need no GPU. It tokenizes as
// the demo replicas do (demoEngine). A scoring pod with no tokenizer files
// for its model tokenizes text and chat prompts through the replica's own
// /tokenize, so both sides key the same blocks; one given the Qwen3 files
// (--tokenizer MODEL=DIR) saves that round trip.
func RunSimReplica(ctx context.Context, c SimReplicaConfig) error {
	if c.Listen == "" || c.Events == "" || c.Replay == "" {
		return errors.New("the HTTP address and both ZeroMQ endpoints are required")
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	enc, tmpl, err := demoEngine()
	if err != nil {
		return err
	}
	cfg := vllmtest.Config{
		Model: c.Model, BlockSize: c.BlockSize, CapacityBlocks: c.CapacityBlocks,
		PrefillTokensPerSec: c.PrefillTokensPerSec, DecodeTokensPerSec: c.DecodeTokensPerSec,
		MaxRunning: c.MaxNumSeqs, SchedulingPolicy: c.SchedulingPolicy,
		Tokenizer: enc, ChatTemplate: tmpl, Topic: c.Topic,
		HTTPAddr: c.Listen, EventsEndpoint: c.Events, ReplayEndpoint: c.Replay,
		Logger: log,
	}
	var r interface {
		Start(context.Context) error
		Stop() error
	}
	if c.DataParallelSize > 1 {
		r, err = vllmtest.NewDataParallel(cfg, c.DataParallelSize, c.IgnoreDataParallelRank)
	} else {
		r, err = vllmtest.New(cfg)
	}
	if err != nil {
		return err
	}
	// Not ctx itself: a replica whose context ends stops on a goroutine of
	// its own, and this process would exit before the requests in flight
	// were answered.
	if err := r.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	<-ctx.Done()
	log.Info("shutting down")
	if err := r.Stop(); err != nil {
		return fmt.Errorf("stop: %w", err)
	}
	return nil
}
