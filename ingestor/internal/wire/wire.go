// Package wire builds vLLM KV-event messages in the byte forms a Python
// publisher produces, for the tests of the event decoder (kvevents) and of
// the ingestor. Each integer type forces one msgpack encoding, so that tests
// cover every width a Python encoder may choose, and OMap keeps its keys in
// the order written, so that golden bytes are stable.
package wire

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// Integer and float types that encode in exactly one msgpack form, whatever
// their value: U64(1) is 0xcf followed by eight bytes, not a fixint.
type (
	U8  uint8
	U16 uint16
	U32 uint32
	U64 uint64
	I64 int64
	F32 float32
)

// EncodeMsgpack implements msgpack.CustomEncoder: always uint8 (0xcc).
func (v U8) EncodeMsgpack(e *msgpack.Encoder) error { return e.EncodeUint8(uint8(v)) }

// EncodeMsgpack implements msgpack.CustomEncoder: always uint16 (0xcd).
func (v U16) EncodeMsgpack(e *msgpack.Encoder) error { return e.EncodeUint16(uint16(v)) }

// EncodeMsgpack implements msgpack.CustomEncoder: always uint32 (0xce).
func (v U32) EncodeMsgpack(e *msgpack.Encoder) error { return e.EncodeUint32(uint32(v)) }

// EncodeMsgpack implements msgpack.CustomEncoder: always uint64 (0xcf).
func (v U64) EncodeMsgpack(e *msgpack.Encoder) error { return e.EncodeUint64(uint64(v)) }

// EncodeMsgpack implements msgpack.CustomEncoder: always int64 (0xd3).
func (v I64) EncodeMsgpack(e *msgpack.Encoder) error { return e.EncodeInt64(int64(v)) }

// EncodeMsgpack implements msgpack.CustomEncoder: always float32 (0xca).
func (v F32) EncodeMsgpack(e *msgpack.Encoder) error { return e.EncodeFloat32(float32(v)) }

// OMap is a map encoded in the order written: each entry is {key, value}.
// Keys are encoded as any value is, so a test may also write a non-string
// key.
type OMap [][2]any

// EncodeMsgpack implements msgpack.CustomEncoder.
func (m OMap) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(len(m)); err != nil {
		return err
	}
	for _, p := range m {
		if err := e.Encode(p[0]); err != nil {
			return err
		}
		if err := e.Encode(p[1]); err != nil {
			return err
		}
	}
	return nil
}

// Encode encodes v with compact integers, as Python's msgpack and msgspec
// do; the types above override that per value.
func Encode(tb testing.TB, v any) []byte {
	tb.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	if err := e.Encode(v); err != nil {
		tb.Fatalf("encode: %v", err)
	}
	return buf.Bytes()
}

// Seq8 is a sequence-number frame: eight bytes, big-endian.
func Seq8(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

// Msg builds a live message [topic, seq, payload] with batch encoded as the
// payload.
func Msg(tb testing.TB, topic string, seq uint64, batch any) [][]byte {
	tb.Helper()
	return [][]byte{[]byte(topic), Seq8(seq), Encode(tb, batch)}
}

// Tokens returns n consecutive token ids from from, as msgpack values.
func Tokens(from, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

// UTokens returns the ids Tokens encodes, as a decoded event holds them.
func UTokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// Stored builds a positional BlockStored event: its type, hashes, parent,
// tokens and block size, then the optional trailing fields in vLLM's order
// (lora_id, medium, lora_name, extra_keys, group_idx, kv_cache_spec_kind).
func Stored(hashes []any, parent any, toks []any, bs int, rest ...any) []any {
	return append([]any{"BlockStored", hashes, parent, toks, bs}, rest...)
}
