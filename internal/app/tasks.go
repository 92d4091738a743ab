package app

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/tokenizer"
	"github.com/kvroute/kvroute/tokenizer/qwen3"
	"github.com/kvroute/kvroute/tokenizer/template"
	"github.com/kvroute/kvroute/vllmtest"
)

// Ingest runs an ingestor over the app's own store: the embedded mode,
// where one process both serves decisions and follows the replicas'
// events. Its metrics join the app's /metrics; it dials replicas through
// the app's Dialer unless cfg names its own.
func Ingest(cfg ingestor.Config) Task {
	return Task{Name: "ingestor", Run: func(ctx context.Context, a *App) error {
		cfg.Store = a.Store
		cfg.MeterProvider = a.tel.MeterProvider
		if cfg.Dialer == nil {
			cfg.Dialer = a.Dialer
		}
		if cfg.Logger == nil {
			cfg.Logger = a.log.With("component", "ingestor")
		}
		if cfg.Seed != a.cfg.Router.Seed {
			return errors.New("ingest: the ingestor's key seed differs from the router's: no request would ever match")
		}
		in, err := ingestor.New(cfg)
		if err != nil {
			return fmt.Errorf("ingest: %w", err)
		}
		return in.Run(ctx)
	}}
}

// DemoModel is the model the demo replicas serve.
const DemoModel = "demo"

// demoTokenizerCacheBytes bounds the tokenization cache the demo replicas
// share: chat traffic resends the whole conversation every turn, and the
// cache makes each turn cost only its new text.
const demoTokenizerCacheBytes = 32 << 20

// demoSystem and demoUser are the chat the printed try-it text sends: the
// system prompt fills a few 16-token blocks, so that a repeat has whole
// blocks to match.
const (
	demoSystem = "You are the kvroute demo assistant. You answer questions about routing requests " +
		"to vLLM replicas by the prefix blocks each replica already holds in its KV cache, " +
		"and you always keep your answers short."
	demoUser = "Why does a repeated prompt come back to the same replica?"
)

// demoEngine loads what a simulated replica tokenizes with: the Qwen3
// tokenizer shipped in the binary (behind a tokenization cache) and its
// chat template, the files kvroute tokenizes model "demo" with.
func demoEngine() (vllmtest.Encoder, vllmtest.ChatRenderer, error) {
	tok, err := qwen3.Load()
	if err != nil {
		return nil, nil, fmt.Errorf("tokenizer: %w", err)
	}
	tmpl, err := template.LoadFS(qwen3.FS, ".", template.Options{})
	if err != nil {
		return nil, nil, fmt.Errorf("chat template: %w", err)
	}
	return tokenizer.NewCache(tok, demoTokenizerCacheBytes), tmpl, nil
}

// DemoReplicas starts n simulated vLLM replicas in this process, registers
// them (events and replay endpoints included, so the embedded ingestor
// follows them) and prints requests a newcomer can paste. The replicas
// tokenize with the embedded Qwen3 tokenizer and chat template, the files
// kvroute itself tokenizes model "demo" with (see cmd/kvroute/serve.go), so
// that text and chat prompts key the same blocks on both sides, as with a
// real vLLM serving Qwen3. They stop with the app.
func DemoReplicas(n int, out io.Writer) Task {
	return Task{Name: "demo-replicas", Warms: true, Run: func(ctx context.Context, a *App) error {
		// Loaded once and shared: parsing takes about half a second, and
		// the tokenizer, its cache and the template are safe for
		// concurrent use.
		enc, tmpl, err := demoEngine()
		if err != nil {
			return fmt.Errorf("demo replica: %w", err)
		}

		var reps []*vllmtest.Replica
		defer func() {
			for _, r := range reps {
				_ = r.Stop()
			}
		}()
		for i := range n {
			r, err := vllmtest.New(vllmtest.Config{
				Model: DemoModel, BlockSize: a.cfg.Router.BlockSize, CapacityBlocks: 4096,
				PrefillTokensPerSec: 20_000, DecodeTokensPerSec: 200,
				Tokenizer: enc, ChatTemplate: tmpl,
				Logger: a.log.With("component", "demo-replica", "replica", i),
			})
			if err != nil {
				return fmt.Errorf("demo replica: %w", err)
			}
			if err := r.Start(ctx); err != nil {
				return fmt.Errorf("demo replica: %w", err)
			}
			reps = append(reps, r)
			rep := kvroute.Replica{
				ID: fmt.Sprintf("demo-%d", i), Model: DemoModel, URL: r.URL(),
				Events: r.EventsEndpoint(), Replay: r.ReplayEndpoint(), Topic: r.Topic(),
				Labels: map[string]string{"demo": "true"},
			}
			if err := a.Store.PutReplica(ctx, rep); err != nil {
				return fmt.Errorf("demo replica: register: %w", err)
			}
		}
		a.Router.Invalidate()
		a.Warmed("demo-replicas")
		_, port, _ := net.SplitHostPort(a.Addr())
		fmt.Fprint(out, demoTryIt(n, port))
		<-ctx.Done()
		return nil
	}}
}

// demoTryIt is the text DemoReplicas prints: a chat completion through
// kvroute, then the decision for the same chat, explained.
func demoTryIt(n int, port string) string {
	// The texts hold no single quote, so the JSON pastes inside the
	// shell's single quotes as it is.
	type message struct {
		Role    string `json:"role"`
		Content string `json:"content"`
	}
	raw, _ := json.Marshal([]message{{"system", demoSystem}, {"user", demoUser}})
	msgs := string(raw)
	return fmt.Sprintf(`
kvroute is serving %[1]d simulated vLLM replicas of model %[2]q (Qwen3's tokenizer
and chat template). Try:

  curl -s localhost:%[3]s/v1/chat/completions -d '{"model":"demo","messages":%[4]s,"max_tokens":8}'

  curl -s localhost:%[3]s/v1/route -d '{"model":"demo","messages":%[4]s,"explain":true}'

  curl -s localhost:%[3]s/v1/replicas

The chat runs on the replica kvroute picks, which caches its prompt. Repeat it
and it routes back to the same replica (curl -i shows X-Kvroute-Replica and
X-Kvroute-Matched-Blocks > 0), reporting cached_tokens 64 of its 65 prompt
tokens with block size 16: every cached block but the one holding the last
token, which vLLM always recomputes. The /v1/route call asks where the same
chat would go: that replica, with matched_blocks > 0. Right after startup the
embedded ingestor takes about half a second to follow the replicas' events;
until then decisions say "index_incomplete": true. A /v1/route decision books load on its replica until
released (curl -s -X POST localhost:%[3]s/v1/requests/REQUEST_ID/release) or
expired; while it lasts that replica looks busier, and a short chat like this
one may go elsewhere.

`, n, DemoModel, port, msgs)
}
