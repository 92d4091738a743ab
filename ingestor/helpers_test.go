package ingestor_test

import (
	"bytes"
	"encoding/binary"
	"testing"

	"github.com/vmihailenco/msgpack/v5"
)

// Wire-form helpers: each type forces one msgpack encoding, so that tests
// cover every integer width a Python encoder may choose.
type (
	u8  uint8
	u16 uint16
	u32 uint32
	u64 uint64
	i64 int64
	f32 float32
)

func (v u8) EncodeMsgpack(e *msgpack.Encoder) error  { return e.EncodeUint8(uint8(v)) }
func (v u16) EncodeMsgpack(e *msgpack.Encoder) error { return e.EncodeUint16(uint16(v)) }
func (v u32) EncodeMsgpack(e *msgpack.Encoder) error { return e.EncodeUint32(uint32(v)) }
func (v u64) EncodeMsgpack(e *msgpack.Encoder) error { return e.EncodeUint64(uint64(v)) }
func (v i64) EncodeMsgpack(e *msgpack.Encoder) error { return e.EncodeInt64(int64(v)) }
func (v f32) EncodeMsgpack(e *msgpack.Encoder) error { return e.EncodeFloat32(float32(v)) }

// omap is a map encoded in the order written, so golden bytes are stable.
type omap []kv

type kv struct {
	k string
	v any
}

func (m omap) EncodeMsgpack(e *msgpack.Encoder) error {
	if err := e.EncodeMapLen(len(m)); err != nil {
		return err
	}
	for _, p := range m {
		if err := e.EncodeString(p.k); err != nil {
			return err
		}
		if err := e.Encode(p.v); err != nil {
			return err
		}
	}
	return nil
}

// mp encodes v with compact integers, as Python's msgpack and msgspec do.
func mp(tb testing.TB, v any) []byte {
	tb.Helper()
	var buf bytes.Buffer
	e := msgpack.NewEncoder(&buf)
	e.UseCompactInts(true)
	if err := e.Encode(v); err != nil {
		tb.Fatalf("encode: %v", err)
	}
	return buf.Bytes()
}

func seq8(n uint64) []byte { return binary.BigEndian.AppendUint64(nil, n) }

// msg builds a live message [topic, seq, payload].
func msg(tb testing.TB, topic string, seq uint64, batch any) [][]byte {
	tb.Helper()
	return [][]byte{[]byte(topic), seq8(seq), mp(tb, batch)}
}

func tokens(from, n int) []any {
	out := make([]any, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

func utokens(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

// stored builds a positional BlockStored with the given trailing fields.
func stored(hashes []any, parent any, toks []any, bs int, rest ...any) []any {
	return append([]any{"BlockStored", hashes, parent, toks, bs}, rest...)
}
