package tokenizer

import (
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
)

// fileJSON is the top level of a tokenizer.json file. Components stay raw
// until their "type" field picks the Go type that parses them.
type fileJSON struct {
	Truncation    json.RawMessage  `json:"truncation"`
	Padding       json.RawMessage  `json:"padding"`
	AddedTokens   []addedTokenJSON `json:"added_tokens"`
	Normalizer    json.RawMessage  `json:"normalizer"`
	PreTokenizer  json.RawMessage  `json:"pre_tokenizer"`
	PostProcessor json.RawMessage  `json:"post_processor"`
	Decoder       json.RawMessage  `json:"decoder"`
	Model         json.RawMessage  `json:"model"`
}

type addedTokenJSON struct {
	ID         uint32 `json:"id"`
	Content    string `json:"content"`
	SingleWord bool   `json:"single_word"`
	LStrip     bool   `json:"lstrip"`
	RStrip     bool   `json:"rstrip"`
	Normalized bool   `json:"normalized"`
	Special    bool   `json:"special"`
}

// typed reads only the "type" field of a component, to dispatch on it.
type typed struct {
	Type string `json:"type"`
}

// isNull reports whether a raw component is absent or JSON null, which
// tokenizer.json uses for "no component here".
func isNull(raw json.RawMessage) bool {
	t := bytes.TrimSpace(raw)
	return len(t) == 0 || bytes.Equal(t, []byte("null"))
}

func componentType(raw json.RawMessage) (string, error) {
	var t typed
	if err := json.Unmarshal(raw, &t); err != nil {
		return "", err
	}
	return t.Type, nil
}

// Load reads dir/tokenizer.json, or dir/tokenizer.json.gz when only the
// compressed file is present (how the embedded Qwen3 files ship). Only
// tokenizer.json is read: Hugging Face's Rust tokenizer ignores
// tokenizer_config.json, and parity is with it.
func Load(dir string) (*Tokenizer, error) {
	return LoadFS(os.DirFS(dir), ".")
}

// LoadFS is Load for a directory inside fsys, so that embedded files load
// without being written to disk.
func LoadFS(fsys fs.FS, dir string) (*Tokenizer, error) {
	data, err := fs.ReadFile(fsys, filepath.ToSlash(filepath.Join(dir, "tokenizer.json")))
	if errors.Is(err, fs.ErrNotExist) {
		data, err = readGzip(fsys, filepath.ToSlash(filepath.Join(dir, "tokenizer.json.gz")))
	}
	if err != nil {
		return nil, fmt.Errorf("tokenizer: load: %w", err)
	}
	return FromJSON(data)
}

func readGzip(fsys fs.FS, name string) ([]byte, error) {
	f, err := fsys.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	data, err := io.ReadAll(zr)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return data, nil
}

// FromJSON builds a Tokenizer from the contents of a tokenizer.json file.
// Every component must be one this package reproduces exactly; anything
// else is an error naming it.
func FromJSON(data []byte) (*Tokenizer, error) {
	var f fileJSON
	if err := json.Unmarshal(data, &f); err != nil {
		return nil, fmt.Errorf("tokenizer: load: %w", err)
	}
	if !isNull(f.Truncation) {
		return nil, errors.New("tokenizer: load: truncation is not supported")
	}
	if !isNull(f.Padding) {
		return nil, errors.New("tokenizer: load: padding is not supported")
	}
	t := &Tokenizer{}
	var err error
	if t.model, err = parseModel(f.Model); err != nil {
		return nil, fmt.Errorf("tokenizer: load: model: %w", err)
	}
	if !isNull(f.Normalizer) {
		if t.normalizer, err = parseNormalizer(f.Normalizer); err != nil {
			return nil, fmt.Errorf("tokenizer: load: normalizer: %w", err)
		}
	}
	if !isNull(f.PreTokenizer) {
		if t.preTokenizer, err = parsePreTokenizer(f.PreTokenizer); err != nil {
			return nil, fmt.Errorf("tokenizer: load: pre_tokenizer: %w", err)
		}
	}
	if !isNull(f.PostProcessor) {
		if t.post, err = parsePostProcessor(f.PostProcessor); err != nil {
			return nil, fmt.Errorf("tokenizer: load: post_processor: %w", err)
		}
	}
	if !isNull(f.Decoder) {
		if t.decoder, err = parseDecoder(f.Decoder); err != nil {
			return nil, fmt.Errorf("tokenizer: load: decoder: %w", err)
		}
	}
	if t.added, err = newAddedVocab(f.AddedTokens, t.model, t.normalizer); err != nil {
		return nil, fmt.Errorf("tokenizer: load: added_tokens: %w", err)
	}
	t.init()
	return t, nil
}
