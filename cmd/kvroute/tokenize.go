package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"strings"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/prompt"
	"github.com/kvroute/kvroute/tokenizer/template"
)

const tokenizeUsage = `Usage: kvroute tokenize --tokenizer DIR [--add-special-tokens[=false]] [--chat] [--jsonl] [TEXT]

Prints the token ids the router keys a prompt with, through the router's own
front door (package prompt), so that anyone can compare them with their
engine's (vLLM's POST /tokenize). DIR holds tokenizer.json (or
tokenizer.json.gz) and tokenizer_config.json.

  TEXT (or stdin)   the text to tokenize; printed as one JSON array
  --chat            the input is a JSON chat body ({"messages", "tools",
                    "add_generation_prompt", "chat_template_kwargs", ...}),
                    rendered with DIR's chat template first
  --jsonl           stdin holds one input a line (a JSON string, or with
                    --chat a JSON object); stdout gets one line each: a JSON
                    array of ids, or {"error": "..."}
  --add-special-tokens
                    the router's choice unless given: on for text, off for
                    chat (the template writes BOS itself), as vLLM's
                    defaults; a chat body's add_special_tokens wins

`

// tokenizeModel is the model name the command's one tokenizer is
// registered under in its front door.
const tokenizeModel = "tokenize"

// runTokenize is `kvroute tokenize`: the router's front door on the
// command line, so that its ids are the ones the router keys.
func runTokenize(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("tokenizer", "", "`DIR` holding tokenizer.json and tokenizer_config.json (required)")
	var special optionalBool
	fs.Var(&special, "add-special-tokens", "add the tokenizer's special tokens (BOS…); default: the router's choice, on for text and off for chat")
	chat := fs.Bool("chat", false, "the input is a JSON chat body, rendered with DIR's chat template")
	jsonl := fs.Bool("jsonl", false, "one input a line on stdin, one JSON line of output each")
	fs.Usage = func() {
		fmt.Fprint(stderr, tokenizeUsage)
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return err
		}
		return usageError{err}
	}
	if *dir == "" {
		return usageError{errors.New("--tokenizer DIR is required")}
	}
	if *jsonl && fs.NArg() > 0 {
		return usageError{errors.New("--jsonl reads its inputs from stdin; give no TEXT")}
	}
	if fs.NArg() > 1 {
		return usageError{fmt.Errorf("one TEXT at most (quote it), got %d arguments", fs.NArg())}
	}
	t, err := newTokenizeCmd(*dir, *chat, special.v, slog.New(slog.NewTextHandler(stderr, nil)))
	if err != nil {
		return err
	}
	if *jsonl {
		return t.lines(ctx, stdin, stdout)
	}
	var input string
	if fs.NArg() == 1 {
		input = fs.Arg(0)
	} else {
		raw, err := io.ReadAll(stdin)
		if err != nil {
			return fmt.Errorf("stdin: %w", err)
		}
		input = string(raw)
	}
	ids, err := t.one(ctx, input)
	if err != nil {
		return err
	}
	return writeIDs(stdout, ids)
}

// tokenizeCmd is the front door over DIR's files, loaded as serve loads
// a --tokenizers folder.
type tokenizeCmd struct {
	front *prompt.Resolver
	// special is --add-special-tokens; nil is the router's choice.
	special *bool
	chat    bool
}

// newTokenizeCmd loads dir; log gets the front door's warnings (why a
// template failed, when the router would route the prompt cache-blind).
func newTokenizeCmd(dir string, chat bool, special *bool, log *slog.Logger) (*tokenizeCmd, error) {
	m, err := prompt.LoadModel(os.DirFS(dir), ".", -1, template.Options{})
	if err != nil {
		return nil, err
	}
	if chat && m.Template == nil {
		return nil, fmt.Errorf("%s has no chat template", dir)
	}
	front, err := prompt.New(prompt.Config{Models: map[string]*prompt.Model{tokenizeModel: m}, Logger: log})
	if err != nil {
		return nil, err
	}
	return &tokenizeCmd{front: front, special: special, chat: chat}, nil
}

// chatBody is a chat request as --chat reads it: vLLM's field names.
type chatBody struct {
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	Documents            json.RawMessage `json:"documents"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	ReasoningEffort      string          `json:"reasoning_effort"`
}

// one tokenizes one input, text or with chat a JSON chat body, as the
// router does: the ids it prints are the ones the router keys (a chat with
// media: the text before the first media part).
func (t *tokenizeCmd) one(ctx context.Context, input string) ([]uint32, error) {
	req := kvroute.TokenizeRequest{Model: tokenizeModel, AddSpecialTokens: t.special}
	if !t.chat {
		req.Prompt = &input
	} else {
		var b chatBody
		if err := json.Unmarshal([]byte(input), &b); err != nil {
			return nil, fmt.Errorf("chat body: %w", err)
		}
		if len(bytes.TrimSpace(b.Messages)) == 0 {
			return nil, errors.New("chat body: messages is required")
		}
		req.Messages, req.Tools, req.Documents, req.ChatTemplateKwargs = b.Messages, b.Tools, b.Documents, b.ChatTemplateKwargs
		req.AddGenerationPrompt, req.ContinueFinalMessage, req.ReasoningEffort = b.AddGenerationPrompt, b.ContinueFinalMessage, b.ReasoningEffort
		if b.AddSpecialTokens != nil {
			req.AddSpecialTokens = b.AddSpecialTokens
		}
	}
	res, err := t.front.Resolve(ctx, prompt.Input{Request: req})
	if err != nil {
		return nil, err
	}
	if res.Blind != "" {
		return nil, fmt.Errorf("the router would route this prompt cache-blind (%s)", res.Blind)
	}
	return res.Tokens, nil
}

// optionalBool is a boolean flag that knows whether it was given.
type optionalBool struct{ v *bool }

func (o *optionalBool) String() string {
	if o == nil || o.v == nil {
		return ""
	}
	return strconv.FormatBool(*o.v)
}

func (o *optionalBool) Set(s string) error {
	b, err := strconv.ParseBool(s)
	if err != nil {
		return err
	}
	o.v = &b
	return nil
}

func (o *optionalBool) IsBoolFlag() bool { return true }

// lines is --jsonl: every line answered, a bad one with its error, so that
// one odd input does not stop a comparison run.
func (t *tokenizeCmd) lines(ctx context.Context, stdin io.Reader, stdout io.Writer) error {
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 0, 1<<20), 256<<20)
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		ids, err := t.line(ctx, line)
		if err != nil {
			msg, _ := json.Marshal(map[string]string{"error": err.Error()})
			w.Write(msg)
			w.WriteByte('\n')
			continue
		}
		if err := writeIDs(w, ids); err != nil {
			return err
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("stdin: %w", err)
	}
	return w.Flush()
}

func (t *tokenizeCmd) line(ctx context.Context, line string) ([]uint32, error) {
	if t.chat {
		return t.one(ctx, line)
	}
	var s string
	if err := json.Unmarshal([]byte(line), &s); err != nil {
		return nil, fmt.Errorf("each line must be a JSON string: %w", err)
	}
	return t.one(ctx, s)
}

func writeIDs(w io.Writer, ids []uint32) error {
	if ids == nil {
		ids = []uint32{}
	}
	raw, err := json.Marshal(ids)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", raw)
	return err
}
