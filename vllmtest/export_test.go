package vllmtest

import (
	"bytes"

	"github.com/vmihailenco/msgpack/v5"
)

// AppendBlock exposes appendBlock to the external tests, which check it
// against the CBOR library.
var AppendBlock = appendBlock

// EncodeTokens renders a token list as events carry it.
func EncodeTokens(ts []int) []byte {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	w := &mpWriter{enc: enc, buf: &buf}
	w.ints(ts)
	return buf.Bytes()
}
