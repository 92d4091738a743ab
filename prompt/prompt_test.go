package prompt_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/internal/telemetry"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/tokenizer/template"
)

// renderer is a function-field Renderer.
type renderer struct {
	RenderFn func(template.Request) (template.Result, error)
}

func (r renderer) Render(req template.Request) (template.Result, error) { return r.RenderFn(req) }

// remote is a function-field Remote that counts its calls.
type remote struct {
	TokenizeFn func(context.Context, kvroute.TokenizeRequest) ([]uint32, error)
	calls      atomic.Int64
}

func (r *remote) Tokenize(ctx context.Context, req kvroute.TokenizeRequest) ([]uint32, error) {
	r.calls.Add(1)
	return r.TokenizeFn(ctx, req)
}

func text(model, s string) prompt.Input {
	return prompt.Input{Request: kvroute.TokenizeRequest{Model: model, Prompt: &s}}
}

func chat(model, messages string) prompt.Input {
	return prompt.Input{Request: kvroute.TokenizeRequest{Model: model, Messages: json.RawMessage(messages)}}
}

func newResolver(t *testing.T, cfg prompt.Config) *prompt.Resolver {
	t.Helper()
	r, err := prompt.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(r.Close)
	return r
}

func TestResolve(t *testing.T) {
	tmpl := renderer{RenderFn: func(req template.Request) (template.Result, error) {
		s := string(req.Messages)
		switch {
		case strings.Contains(s, "raise"):
			return template.Result{}, &template.RequestError{Msg: "Conversation roles must alternate"}
		case strings.Contains(s, "broken"):
			return template.Result{}, errors.New("engine cannot render this")
		case strings.Contains(s, "image"):
			return template.Result{Prompt: "<s>user: look at", TextPrefix: len("<s>user: ")}, nil
		}
		return template.Result{Prompt: "<s>user: hi", TextPrefix: len("<s>user: hi")}, nil
	}}
	models := map[string]*prompt.Model{"local": {Encoder: mock.ByteEncoder{}, Template: tmpl}, "notmpl": {Encoder: mock.ByteEncoder{}}}
	rem := &remote{TokenizeFn: func(_ context.Context, req kvroute.TokenizeRequest) ([]uint32, error) {
		if req.Model == "down" {
			return nil, errors.New("connection refused")
		}
		return []uint32{7, 8, 9}, nil
	}}
	withRemote := newResolver(t, prompt.Config{Models: models, Remote: rem})
	noRemote := newResolver(t, prompt.Config{Models: models})
	enc := mock.ByteEncoder{}.IDs

	for _, tc := range []struct {
		name     string
		r        *prompt.Resolver
		in       prompt.Input
		want     []uint32
		source   prompt.Source
		blind    string
		partial  string
		errField string
	}{
		{name: "token ids given", r: noRemote, in: prompt.Input{TokenIDs: []uint32{5, 6}, HasTokenIDs: true}, want: []uint32{5, 6}, source: prompt.SourceGiven},
		{name: "text, special tokens by default", r: noRemote, in: text("local", "ab"), want: enc("ab", true), source: prompt.SourceLocal},
		{name: "chat, no special tokens by default", r: noRemote, in: chat("local", `[{"role":"user","content":"hi"}]`), want: enc("<s>user: hi", false), source: prompt.SourceLocal},
		{name: "template raises: the client's error", r: withRemote, in: chat("local", `["raise"]`), errField: "messages"},
		{name: "template fails: remote instead", r: withRemote, in: chat("local", `["broken"]`), want: []uint32{7, 8, 9}, source: prompt.SourceRemote},
		{name: "template fails, no remote: blind", r: noRemote, in: chat("local", `["broken"]`), source: prompt.SourceNone, blind: prompt.BlindTemplateError},
		{name: "no template: remote", r: withRemote, in: chat("notmpl", `[]`), want: []uint32{7, 8, 9}, source: prompt.SourceRemote},
		{name: "multimodal: the text before the part, less the seam token", r: noRemote, in: chat("local", `["image"]`), want: enc("<s>user: ", false)[:8], source: prompt.SourceLocal, partial: prompt.PartialMultimodal},
		{name: "unknown model: remote", r: withRemote, in: text("other", "x"), want: []uint32{7, 8, 9}, source: prompt.SourceRemote},
		{name: "unknown model, no remote: blind", r: noRemote, in: text("other", "x"), source: prompt.SourceNone, blind: prompt.BlindNoTokenizer},
		{name: "remote down: blind", r: withRemote, in: text("down", "x"), source: prompt.SourceNone, blind: prompt.BlindTokenizerUnavailable},
		{name: "prompt embeddings: blind", r: withRemote, in: prompt.Input{PromptEmbeds: true, Request: kvroute.TokenizeRequest{Model: "local"}}, source: prompt.SourceNone, blind: prompt.BlindPromptEmbeds},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := tc.r.Resolve(context.Background(), tc.in)
			if tc.errField != "" {
				var fe *kvroute.FieldError
				if !errors.As(err, &fe) || fe.Field != tc.errField || !errors.Is(err, kvroute.ErrInvalidInput) {
					t.Fatalf("err = %v, want a field error on %s", err, tc.errField)
				}
				if !strings.Contains(err.Error(), "Conversation roles must alternate") {
					t.Errorf("err = %v, want the template's message", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got.Tokens, tc.want) || got.Source != tc.source || got.Blind != tc.blind || got.Partial != tc.partial {
				t.Errorf("got %+v\nwant tokens %v source %s blind %q partial %q", got, tc.want, tc.source, tc.blind, tc.partial)
			}
		})
	}
}

func TestRemoteCache(t *testing.T) {
	rem := &remote{TokenizeFn: func(_ context.Context, req kvroute.TokenizeRequest) ([]uint32, error) {
		return []uint32{uint32(len(*req.Prompt))}, nil
	}}
	r := newResolver(t, prompt.Config{Remote: rem})
	for range 3 {
		if _, err := r.Resolve(context.Background(), text("m", "same")); err != nil {
			t.Fatal(err)
		}
	}
	got, _ := r.Resolve(context.Background(), text("m", "other"))
	if n := rem.calls.Load(); n != 2 {
		t.Errorf("remote calls = %d, want 2 (one per distinct prompt)", n)
	}
	if !slices.Equal(got.Tokens, []uint32{5}) {
		t.Errorf("tokens = %v, want [5]", got.Tokens)
	}
	t.Run("options are part of the key", func(t *testing.T) {
		in := text("m", "same")
		no := false
		in.Request.AddSpecialTokens = &no
		if _, err := r.Resolve(context.Background(), in); err != nil {
			t.Fatal(err)
		}
		if n := rem.calls.Load(); n != 3 {
			t.Errorf("remote calls = %d, want 3", n)
		}
	})
}

func TestShadow(t *testing.T) {
	for _, tc := range []struct {
		name   string
		remote []uint32
	}{
		{"match", []uint32{1, 'a' + 3}},
		{"mismatch", []uint32{1, 99}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rem := &remote{TokenizeFn: func(context.Context, kvroute.TokenizeRequest) ([]uint32, error) { return tc.remote, nil }}
			reg := prometheus.NewRegistry()
			mp, err := telemetry.NewMeterProvider(reg)
			if err != nil {
				t.Fatal(err)
			}
			r := newResolver(t, prompt.Config{
				Models: map[string]*prompt.Model{"m": {Encoder: mock.ByteEncoder{}}},
				Remote: rem, ShadowRate: 1, Rand: func() float64 { return 0 }, MeterProvider: mp,
				VerifyMatches: -1, // no forwarding check beside the shadow's
			})
			got, err := r.Resolve(context.Background(), text("m", "a"))
			if err != nil {
				t.Fatal(err)
			}
			r.Close()
			if got.Source != prompt.SourceLocal {
				t.Errorf("source = %s, want local: shadowing never changes the answer", got.Source)
			}
			if n := rem.calls.Load(); n != 1 {
				t.Errorf("remote calls = %d, want 1", n)
			}
			c, err := testutil.GatherAndCount(reg, "kvroute_tokenizer_shadow_total")
			if err != nil || c != 1 {
				t.Fatalf("shadow series = %d (%v), want 1", c, err)
			}
			want := "# HELP kvroute_tokenizer_shadow_total Locally tokenized prompts also tokenized by a replica, by model and result (match, mismatch, error, skipped).\n# TYPE kvroute_tokenizer_shadow_total counter\nkvroute_tokenizer_shadow_total{model=\"m\",result=\"" + tc.name + "\"} 1\n"
			if err := testutil.GatherAndCompare(reg, strings.NewReader(want), "kvroute_tokenizer_shadow_total"); err != nil {
				t.Error(err)
			}
		})
	}
	t.Run("needs a remote", func(t *testing.T) {
		if _, err := prompt.New(prompt.Config{ShadowRate: 0.5}); err == nil {
			t.Error("New accepted a shadow rate without a remote")
		}
	})
}

func TestFirstDifference(t *testing.T) {
	for _, tc := range []struct {
		a, b []uint32
		want int
	}{
		{[]uint32{1, 2, 3}, []uint32{1, 2, 3}, -1},
		{[]uint32{1, 2, 3}, []uint32{1, 5, 3}, 1},
		{[]uint32{1, 2}, []uint32{1, 2, 3}, 2},
		{nil, nil, -1},
	} {
		if got := prompt.FirstDifference(tc.a, tc.b); got != tc.want {
			t.Errorf("FirstDifference(%v, %v) = %d, want %d", tc.a, tc.b, got, tc.want)
		}
	}
}
