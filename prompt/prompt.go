// Package prompt is kvroute's front door: it turns what a client sends
// (token ids, a text prompt, or chat messages) into the token ids the
// engine will compute for it, because block keys are chained over token
// ids and one differing token makes every key after it miss. A model's
// prompts are tokenized in process when kvroute has its tokenizer files
// (a Model), else by one of the model's replicas (a Remote), and when
// neither can answer the decision is cache-blind and says why: never a
// silently wrong key.
package prompt

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"

	"go.opentelemetry.io/otel/metric"

	"github.com/kvroute/kvroute"
)

// Source says where a prompt's token ids came from.
type Source string

const (
	// SourceGiven: the client sent token ids.
	SourceGiven Source = "given"
	// SourceLocal: kvroute's own tokenizer and chat template.
	SourceLocal Source = "local"
	// SourceRemote: a replica of the model tokenized it.
	SourceRemote Source = "remote"
	// SourceNone: nothing could; the decision is cache-blind.
	SourceNone Source = "none"
)

// Reasons a decision is cache-blind (Result.Blind), and why a prompt was
// keyed only in part (Result.Partial). They are part of the API: the
// decision body and /metrics carry them.
const (
	BlindNoTokenizer = "no-tokenizer"
	// BlindTemplateError: the local template failed in a way vLLM's would
	// not (a template that raises is the client's 400 instead).
	BlindTemplateError = "template-error"
	// BlindTokenizerUnavailable: the remote tokenizer failed or timed out.
	BlindTokenizerUnavailable = "tokenizer-unavailable"
	// BlindPromptEmbeds: prompt embeddings have no token ids to key.
	BlindPromptEmbeds = "prompt-embeds"
	// PartialMultimodal: the keyed tokens end before the first image,
	// audio or video part, whose tokens only the engine's processor knows.
	PartialMultimodal = "multimodal"
)

// Input is one client prompt. Exactly one of TokenIDs, Request.Prompt and
// Request.Messages is set by the caller (PromptEmbeds aside).
type Input struct {
	Request kvroute.TokenizeRequest
	// TokenIDs are ids the client computed itself; HasTokenIDs
	// distinguishes an empty list from none.
	TokenIDs    []uint32
	HasTokenIDs bool
	// PromptEmbeds is true when the client sent prompt embeddings.
	PromptEmbeds bool
}

// Result is a prompt's token ids as the engine will see them.
type Result struct {
	// Tokens are the ids to key blocks with; with Partial set, only the
	// part before the first non-text content.
	Tokens []uint32
	// PromptTokens is the prompt's length in tokens as far as known (with
	// Partial, the tokens before the first media part).
	PromptTokens int
	Source       Source
	// Blind is why the decision must be cache-blind; empty when keyed.
	Blind string
	// Partial is why only a prefix was keyed; empty when all was.
	Partial string
	// Forward says Tokens may go to the engine in place of the text: a
	// whole text prompt tokenized by a local tokenizer shown to agree
	// with the model's replicas (verify.go).
	Forward bool
}

// Remote tokenizes on one of the model's replicas (vLLM's /tokenize or
// render endpoints). It is declared here, where it is used.
type Remote interface {
	// Tokenize returns the token ids a replica of req's model computes for
	// its prompt; an error makes the decision cache-blind, never wrong.
	Tokenize(ctx context.Context, req kvroute.TokenizeRequest) ([]uint32, error)
}

// Config wires a Resolver.
type Config struct {
	// Models are the models kvroute tokenizes itself, by name; nil means
	// none.
	Models map[string]*Model
	// Remote tokenizes the prompts of every other model; nil means those
	// decisions are cache-blind (BlindNoTokenizer).
	Remote Remote
	// RemoteCacheBytes bounds the cache of remote answers; zero means
	// 32 MiB, negative disables it.
	RemoteCacheBytes int64
	// ShadowRate is the fraction of locally tokenized prompts that are
	// also tokenized by Remote and compared, to catch a tokenizer or
	// template that drifted from the engine's; 0 (the default) never.
	ShadowRate float64
	// ShadowConcurrency bounds the shadow comparisons in flight; a
	// prompt sampled while the bound is reached is not shadowed. Zero
	// means 4.
	ShadowConcurrency int
	// VerifyMatches is how many of a local model's text tokenizations
	// must equal its replicas' (Remote) before Result.Forward lets its
	// ids be forwarded in place of the text (verify.go); zero means
	// DefaultVerifyMatches, negative forwards without verifying. With no
	// Remote nothing can be verified and nothing is forwarded.
	VerifyMatches int
	// Rand samples the shadowed prompts; nil means a random source.
	Rand func() float64
	// Logger receives shadow mismatches and remote failures; nil
	// discards them.
	Logger *slog.Logger
	// MeterProvider receives the front door's metrics (metrics.go); nil
	// means a no-op provider: nothing is recorded.
	MeterProvider metric.MeterProvider
}

// Resolver is the front door. It is safe for concurrent use.
type Resolver struct {
	cfg    Config
	log    *slog.Logger
	m      *metrics
	remote *remoteCache
	shadow chan struct{}
	fwd    forwarding
	wg     sync.WaitGroup
}

// New builds a Resolver.
func New(cfg Config) (*Resolver, error) {
	if cfg.ShadowRate < 0 || cfg.ShadowRate > 1 || cfg.ShadowRate != cfg.ShadowRate {
		return nil, fmt.Errorf("prompt: shadow rate must be in 0..1, got %v", cfg.ShadowRate)
	}
	if cfg.ShadowRate > 0 && cfg.Remote == nil {
		return nil, errors.New("prompt: a shadow rate needs a remote tokenizer to compare with")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Rand == nil {
		cfg.Rand = rand.Float64
	}
	if cfg.ShadowConcurrency <= 0 {
		cfg.ShadowConcurrency = 4
	}
	if cfg.VerifyMatches == 0 {
		cfg.VerifyMatches = DefaultVerifyMatches
	}
	if cfg.RemoteCacheBytes == 0 {
		cfg.RemoteCacheBytes = 32 << 20
	}
	r := &Resolver{cfg: cfg, log: cfg.Logger, shadow: make(chan struct{}, cfg.ShadowConcurrency)}
	if cfg.Remote != nil && cfg.RemoteCacheBytes > 0 {
		r.remote = newRemoteCache(cfg.RemoteCacheBytes)
	}
	var err error
	if r.m, err = newMetrics(cfg.MeterProvider, r); err != nil {
		return nil, fmt.Errorf("prompt: metrics: %w", err)
	}
	return r, nil
}

// Local reports whether model is tokenized in process.
func (r *Resolver) Local(model string) bool { return r.cfg.Models[model] != nil }

// Resolve returns the prompt's token ids. A client error (a chat the
// model's template refuses, invalid UTF-8) is an error wrapping
// kvroute.ErrInvalidInput that names the field; every failure of kvroute's
// own is a cache-blind Result instead, so that routing goes on.
func (r *Resolver) Resolve(ctx context.Context, in Input) (Result, error) {
	model := in.Request.Model
	res, err := r.resolve(ctx, in)
	if err == nil {
		r.m.prompts.WithLabelValues(model, string(res.Source)).Inc()
		if res.Blind != "" {
			r.m.blind.WithLabelValues(model, res.Blind).Inc()
		}
	}
	return res, err
}

func (r *Resolver) resolve(ctx context.Context, in Input) (Result, error) {
	switch {
	case in.HasTokenIDs:
		return Result{Tokens: in.TokenIDs, PromptTokens: len(in.TokenIDs), Source: SourceGiven}, nil
	case in.PromptEmbeds:
		return Result{Source: SourceNone, Blind: BlindPromptEmbeds}, nil
	}
	req := in.Request
	if m := r.cfg.Models[req.Model]; m != nil {
		res, err := m.tokenize(req)
		var te *templateFailure
		switch {
		case errors.As(err, &te) && r.cfg.Remote != nil:
			r.log.Warn("local chat template failed; tokenizing remotely", "model", req.Model, "err", te.err)
		case errors.As(err, &te):
			r.log.Warn("local chat template failed; routing cache-blind", "model", req.Model, "err", te.err)
			return Result{Source: SourceNone, Blind: BlindTemplateError}, nil
		case err != nil:
			return Result{}, err
		default:
			if r.cfg.ShadowRate > 0 && res.Partial == "" && r.cfg.Rand() < r.cfg.ShadowRate {
				r.shadowCompare(req, res.Tokens)
			}
			res.Forward = res.Partial == "" && r.forwardable(req, res.Tokens)
			return res, nil
		}
	}
	if r.cfg.Remote == nil {
		return Result{Source: SourceNone, Blind: BlindNoTokenizer}, nil
	}
	ids, err := r.remoteTokenize(ctx, req)
	if err != nil {
		if errors.Is(err, kvroute.ErrInvalidInput) {
			return Result{}, err
		}
		r.log.Warn("remote tokenization failed; routing cache-blind", "model", req.Model, "err", err)
		return Result{Source: SourceNone, Blind: BlindTokenizerUnavailable}, nil
	}
	return Result{Tokens: ids, PromptTokens: len(ids), Source: SourceRemote}, nil
}

// remoteTokenize asks Remote, answering repeats from the cache.
func (r *Resolver) remoteTokenize(ctx context.Context, req kvroute.TokenizeRequest) ([]uint32, error) {
	var key string
	if r.remote != nil {
		key = requestKey(req)
		if ids, ok := r.remote.get(key); ok {
			r.m.remoteCache.WithLabelValues("hit").Inc()
			return ids, nil
		}
		r.m.remoteCache.WithLabelValues("miss").Inc()
	}
	ids, err := r.cfg.Remote.Tokenize(ctx, req)
	if err != nil {
		return nil, err
	}
	if r.remote != nil {
		r.remote.put(key, ids)
	}
	return ids, nil
}

// Close waits for shadow comparisons in flight.
func (r *Resolver) Close() { r.wg.Wait() }
