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
	"os"
	"strings"

	"github.com/kvroute/kvroute/tokenizer"
	"github.com/kvroute/kvroute/tokenizer/template"
)

const tokenizeUsage = `Usage: kvroute tokenize --tokenizer DIR [--add-special-tokens] [--chat] [--jsonl] [TEXT]

Prints the token ids kvroute computes, so that anyone can compare them with
their engine's (vLLM's POST /tokenize). DIR holds tokenizer.json (or
tokenizer.json.gz) and tokenizer_config.json.

  TEXT (or stdin)   the text to tokenize; printed as one JSON array
  --chat            the input is a JSON chat body ({"messages", "tools",
                    "add_generation_prompt", "chat_template_kwargs", ...}),
                    rendered with DIR's chat template first
  --jsonl           stdin holds one input a line (a JSON string, or with
                    --chat a JSON object); stdout gets one line each: a JSON
                    array of ids, or {"error": "..."}

`

// runTokenize is `kvroute tokenize`: the same tokenizer and chat template
// the router keys prompts with, on the command line.
func runTokenize(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("tokenize", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dir := fs.String("tokenizer", "", "`DIR` holding tokenizer.json and tokenizer_config.json (required)")
	special := fs.Bool("add-special-tokens", false, "add the tokenizer's special tokens (BOS…), as vLLM does by default for completions")
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
	tok, err := tokenizer.Load(*dir)
	if err != nil {
		return err
	}
	t := &tokenizeCmd{tok: tok, special: *special, chat: *chat}
	if *chat {
		if t.tmpl, err = template.LoadFS(os.DirFS(*dir), ".", template.Options{}); err != nil {
			return err
		}
	}
	if *jsonl {
		return t.lines(stdin, stdout)
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
	ids, err := t.one(input)
	if err != nil {
		return err
	}
	return writeIDs(stdout, ids)
}

type tokenizeCmd struct {
	tok     *tokenizer.Tokenizer
	tmpl    *template.Template
	special bool
	chat    bool
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

// one tokenizes one input: text, or with chat a JSON chat body.
func (t *tokenizeCmd) one(input string) ([]uint32, error) {
	if !t.chat {
		return t.tok.Encode(input, t.special)
	}
	var b chatBody
	if err := json.Unmarshal([]byte(input), &b); err != nil {
		return nil, fmt.Errorf("chat body: %w", err)
	}
	if len(bytes.TrimSpace(b.Messages)) == 0 {
		return nil, errors.New("chat body: messages is required")
	}
	out, err := t.tmpl.Render(template.Request{
		Messages: b.Messages, Tools: b.Tools, Documents: b.Documents, Kwargs: b.ChatTemplateKwargs,
		AddGenerationPrompt: b.AddGenerationPrompt, ContinueFinalMessage: b.ContinueFinalMessage,
		ReasoningEffort: b.ReasoningEffort,
	})
	if err != nil {
		return nil, err
	}
	special := t.special
	if b.AddSpecialTokens != nil {
		special = *b.AddSpecialTokens
	}
	return t.tok.Encode(out.Prompt, special)
}

// lines is --jsonl: every line answered, a bad one with its error, so that
// one odd input does not stop a comparison run.
func (t *tokenizeCmd) lines(stdin io.Reader, stdout io.Writer) error {
	sc := bufio.NewScanner(stdin)
	sc.Buffer(make([]byte, 0, 1<<20), 256<<20)
	w := bufio.NewWriter(stdout)
	defer w.Flush()
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		ids, err := t.line(line)
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

func (t *tokenizeCmd) line(line string) ([]uint32, error) {
	if t.chat {
		return t.one(line)
	}
	var s string
	if err := json.Unmarshal([]byte(line), &s); err != nil {
		return nil, fmt.Errorf("each line must be a JSON string: %w", err)
	}
	return t.one(s)
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
