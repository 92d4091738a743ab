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
	// Logger receives its logs; nil discards them.
	Logger *slog.Logger
}

// RunSimReplica runs one simulated vLLM replica until ctx ends: the process
// behind `kvroute sim-replica`, so that a local fleet (compose.yaml) or a
// staging cluster can run Redis, scoring pods and ingestors for real
// against engines that need no GPU. It tokenizes as the demo replicas do
// (demoEngine), so kvroute's built-in tokenizer for model "demo" and the
// replica key the same blocks; under another model name kvroute tokenizes
// through the replica's /tokenize, with the same result.
func RunSimReplica(ctx context.Context, c SimReplicaConfig) error {
	if c.Listen == "" || c.Events == "" || c.Replay == "" {
		return errors.New("sim-replica: the HTTP address and both ZeroMQ endpoints are required")
	}
	log := c.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	enc, tmpl, err := demoEngine()
	if err != nil {
		return fmt.Errorf("sim-replica: %w", err)
	}
	r, err := vllmtest.New(vllmtest.Config{
		Model: c.Model, BlockSize: c.BlockSize, CapacityBlocks: c.CapacityBlocks,
		PrefillTokensPerSec: c.PrefillTokensPerSec, DecodeTokensPerSec: c.DecodeTokensPerSec,
		Tokenizer: enc, ChatTemplate: tmpl, Topic: c.Topic,
		HTTPAddr: c.Listen, EventsEndpoint: c.Events, ReplayEndpoint: c.Replay,
		Logger: log,
	})
	if err != nil {
		return fmt.Errorf("sim-replica: %w", err)
	}
	if err := r.Start(ctx); err != nil {
		return fmt.Errorf("sim-replica: %w", err)
	}
	log.Info("simulated vLLM replica serving", "model", c.Model, "url", r.URL(),
		"events", r.EventsEndpoint(), "replay", r.ReplayEndpoint(), "topic", r.Topic())
	<-ctx.Done()
	log.Info("shutting down")
	if err := r.Stop(); err != nil {
		return fmt.Errorf("sim-replica: stop: %w", err)
	}
	return nil
}
