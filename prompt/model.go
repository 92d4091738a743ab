package prompt

import (
	"errors"
	"fmt"
	"io/fs"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/tokenizer"
	"github.com/kvroute/kvroute/tokenizer/template"
)

// Encoder turns text into token ids; *tokenizer.Tokenizer and
// *tokenizer.Cache are Encoders.
type Encoder interface {
	// Encode tokenizes text, with the tokenizer's special tokens (its
	// post-processor: BOS and the like) when addSpecialTokens is set.
	Encode(text string, addSpecialTokens bool) ([]uint32, error)
}

// Renderer renders a chat request to the prompt text the engine
// tokenizes; *template.Template is a Renderer.
type Renderer interface {
	// Render applies the chat template to req's messages, tools and
	// options; an error the template raises is the client's.
	Render(req template.Request) (template.Result, error)
}

// Model is one model's tokenizer and chat template, loaded from the same
// files the engine loads.
type Model struct {
	// Encoder tokenizes; required.
	Encoder Encoder
	// Template renders chats; nil means the model has none, and its chat
	// prompts go to the Remote (or are cache-blind).
	Template Renderer
}

// templateFailure is the local template failing where the engine's would
// not: the request goes remote, or cache-blind, never wrong.
type templateFailure struct{ err error }

func (e *templateFailure) Error() string { return e.err.Error() }

var errNoTemplate = errors.New("the model has no chat template")

// tokenize runs the model's own pipeline: the chat template for a chat,
// then the tokenizer.
func (m *Model) tokenize(req kvroute.TokenizeRequest) (Result, error) {
	res := Result{Source: SourceLocal}
	text := ""
	if req.Chat() {
		if m.Template == nil {
			return Result{}, &templateFailure{errNoTemplate}
		}
		out, err := m.Template.Render(template.Request{
			Messages: req.Messages, Tools: req.Tools, Documents: req.Documents,
			AddGenerationPrompt: req.AddGenerationPrompt, ContinueFinalMessage: req.ContinueFinalMessage,
			Kwargs: req.ChatTemplateKwargs, ReasoningEffort: req.ReasoningEffort,
		})
		var re *template.RequestError
		switch {
		case errors.As(err, &re):
			// vLLM refuses the same request; so does kvroute, with the
			// template's own words.
			return Result{}, &kvroute.FieldError{Field: "messages", Msg: "were refused by the model's chat template: " + re.Msg}
		case err != nil:
			return Result{}, &templateFailure{err}
		}
		text = out.Prompt
		if out.TextPrefix < len(out.Prompt) {
			text, res.Partial = out.Prompt[:out.TextPrefix], PartialMultimodal
		}
	} else {
		text = *req.Prompt
	}
	ids, err := m.Encoder.Encode(text, req.SpecialTokens())
	if errors.Is(err, tokenizer.ErrInvalidUTF8) {
		field := "prompt"
		if req.Chat() {
			field = "messages"
		}
		return Result{}, &kvroute.FieldError{Field: field, Msg: "is not valid UTF-8"}
	}
	if err != nil {
		return Result{}, fmt.Errorf("prompt: tokenize: %w", err)
	}
	res.Tokens, res.PromptTokens = ids, len(ids)
	if res.Partial != "" && len(ids) > 0 {
		// The text before a media part ends where the engine's prompt
		// goes on: the last token may merge with what follows there.
		res.Tokens = ids[:len(ids)-1]
	}
	return res, nil
}

// DefaultCacheBytes is each local model's tokenization cache budget when
// LoadModel is given none.
const DefaultCacheBytes = 64 << 20

// LoadModel loads a model's tokenizer.json (or tokenizer.json.gz) and the
// chat template of its tokenizer_config.json from dir in fsys
// (os.DirFS for a folder, an embed.FS for files shipped in the binary).
// A folder without a chat template gives a Model without one. The
// tokenizer is wrapped in a cache of cacheBytes (0: DefaultCacheBytes;
// negative: no cache), so that a conversation's turn N costs only its new
// text.
func LoadModel(fsys fs.FS, dir string, cacheBytes int64, opt template.Options) (*Model, error) {
	tok, err := tokenizer.LoadFS(fsys, dir)
	if err != nil {
		return nil, fmt.Errorf("prompt: %w", err)
	}
	m := &Model{Encoder: tok}
	if cacheBytes == 0 {
		cacheBytes = DefaultCacheBytes
	}
	if cacheBytes > 0 {
		m.Encoder = tokenizer.NewCache(tok, cacheBytes)
	}
	tmpl, err := template.LoadFS(fsys, dir, opt)
	switch {
	case err == nil:
		m.Template = tmpl
	case errors.Is(err, template.ErrNoTemplate):
	default:
		return nil, fmt.Errorf("prompt: %w", err)
	}
	return m, nil
}
