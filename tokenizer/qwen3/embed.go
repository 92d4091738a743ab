// Package qwen3 ships the Qwen3 tokenizer files inside the binary, so that
// a kvroute demo can tokenize with no network and no files on disk.
// See NOTICE for their provenance and licence (Apache-2.0).
package qwen3

import (
	"embed"

	"github.com/kvroute/kvroute/tokenizer"
)

// FS holds tokenizer.json.gz, tokenizer_config.json, LICENSE and NOTICE at
// its root.
//
//go:embed tokenizer.json.gz tokenizer_config.json LICENSE NOTICE
var FS embed.FS

// Load builds the Qwen3 tokenizer from FS. Each call parses the files
// afresh (about half a second), so callers should load once and share the
// result, which is safe for concurrent use.
func Load() (*tokenizer.Tokenizer, error) {
	return tokenizer.LoadFS(FS, ".")
}
