package app

import (
	"fmt"
	"io/fs"
	"os"
	"time"

	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/tokenizer/remote"
	"github.com/kvroute/kvroute/tokenizer/template"
)

// Tokenizers says where each model's prompts are tokenized.
type Tokenizers struct {
	// Dirs maps a model to the folder holding its tokenizer.json and
	// tokenizer_config.json, loaded at start; a model not in Dirs or FS
	// is tokenized by its replicas. Nil means no local tokenizers.
	Dirs map[string]string
	// FS maps a model to tokenizer files in a file system (the demo's
	// embedded Qwen3 files); nil means none.
	FS map[string]fs.FS
	// NoRemote turns remote tokenization off: the text and chat prompts
	// of models without local files are routed cache-blind.
	NoRemote bool
	// RemoteTimeout bounds one remote tokenization; zero means 2 s.
	RemoteTimeout time.Duration
	// ShadowRate is the fraction of locally tokenized prompts checked
	// against a replica's tokenization; zero means none.
	ShadowRate float64
	// CacheBytes is each local model's tokenization cache; zero means
	// prompt.DefaultCacheBytes, negative none.
	CacheBytes int64
	// NoTokenForwarding keeps completions' text prompts as sent instead
	// of forwarding kvroute's ids.
	NoTokenForwarding bool
	// VerifyMatches is how many of a local model's text tokenizations
	// must equal a replica's before its ids are forwarded
	// (prompt.Config.VerifyMatches); zero means
	// prompt.DefaultVerifyMatches, negative forwards unverified.
	VerifyMatches int
}

// buildPrompts loads every local model's files and builds the front door.
// A folder that does not load fails the start: a typo must not turn into
// silent cache-blind routing.
func (a *App) buildPrompts(t Tokenizers) (*prompt.Resolver, error) {
	models := map[string]*prompt.Model{}
	load := func(model string, fsys fs.FS, where string) error {
		if _, dup := models[model]; dup {
			return fmt.Errorf("tokenizer: model %q is configured twice", model)
		}
		start := time.Now()
		m, err := prompt.LoadModel(fsys, ".", t.CacheBytes, template.Options{})
		if err != nil {
			return fmt.Errorf("tokenizer for model %q (%s): %w", model, where, err)
		}
		models[model] = m
		a.log.Info("loaded tokenizer", "model", model, "from", where, "chat_template", m.Template != nil, "took", time.Since(start).Round(time.Millisecond))
		return nil
	}
	for model, dir := range t.Dirs {
		if err := load(model, os.DirFS(dir), dir); err != nil {
			return nil, err
		}
	}
	for model, fsys := range t.FS {
		if err := load(model, fsys, "embedded"); err != nil {
			return nil, err
		}
	}
	cfg := prompt.Config{Models: models, ShadowRate: t.ShadowRate, VerifyMatches: t.VerifyMatches,
		Logger: a.log.With("component", "prompt"), MeterProvider: a.tel.MeterProvider}
	if !t.NoRemote {
		rc, err := remote.New(remote.Config{Replicas: a.Router.Fleet, Timeout: t.RemoteTimeout, Transport: a.Dialer.Transport()})
		if err != nil {
			return nil, err
		}
		cfg.Remote = rc
	}
	return prompt.New(cfg)
}
