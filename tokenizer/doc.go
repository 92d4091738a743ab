// Package tokenizer encodes text into token ids exactly as Hugging Face's
// Rust tokenizers library does for a tokenizer.json file, in process.
//
// Token parity is the point: the router hashes blocks of token ids, so one
// differing id changes every block key after it. The package therefore
// implements only the components whose behaviour it reproduces exactly
// (BPE models, the common normalizers, pre-tokenizers, post-processors and
// decoders), and a tokenizer.json naming anything else fails to load
// rather than being approximated. Golden fixtures produced by Hugging
// Face's own tokenizer (see testdata/README.md) prove the parity.
//
// A Tokenizer is immutable after loading and safe for concurrent use. A
// Cache in front of it makes re-encoding a growing conversation cost only
// its new text.
package tokenizer
