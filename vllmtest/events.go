package vllmtest

import (
	"bytes"
	"encoding/binary"
	"fmt"

	"github.com/vmihailenco/msgpack/v5"
)

// Event encodings, chosen by Config.EventEncoding.
const (
	// EncodingArray is the positional-array form every vLLM release sent up
	// to mid-2026: ["BlockStored", block_hashes, parent, token_ids, ...].
	EncodingArray = "array"
	// EncodingMap is the form of vLLM PR #42892 and later: one map per event
	// with its type under "type".
	EncodingMap = "map"
)

// mediumGPU is the only tier this replica has: it simulates no offloading.
const mediumGPU = "GPU"

// event is one KV-cache event before encoding.
type event interface{ isEvent() }

type blockStored struct {
	hashes    []uint64
	parent    *uint64
	tokens    []int
	blockSize int
	loraID    int // 0 means none
	loraName  string
	extraKeys [][]any // one entry per block, nil or the block's keys
}

type blockRemoved struct{ hashes []uint64 }

type allBlocksCleared struct{}

func (blockStored) isEvent()      {}
func (blockRemoved) isEvent()     {}
func (allBlocksCleared) isEvent() {}

// encodeBatch renders one batch as vLLM's msgspec encoder does:
// [ts float64, events, data_parallel_rank]. Integers take their shortest
// msgpack form (uint64 0xcf only for hashes >= 2^63) and ts stays a float64,
// because that is what a Python publisher emits and what decoders must accept.
func encodeBatch(encoding string, ts float64, events []event, rank int) ([]byte, error) {
	var buf bytes.Buffer
	enc := msgpack.NewEncoder(&buf)
	enc.UseCompactInts(true)
	w := &mpWriter{enc: enc, buf: &buf}
	w.arrayLen(3)
	w.float64(ts)
	w.arrayLen(len(events))
	for _, ev := range events {
		if encoding == EncodingMap {
			w.eventMap(ev)
		} else {
			w.eventArray(ev)
		}
	}
	w.uint(uint64(rank)) // data_parallel_rank
	if w.err != nil {
		return nil, fmt.Errorf("msgpack batch: %w", w.err)
	}
	return buf.Bytes(), nil
}

// mpWriter keeps the first encoding error so that the event layouts read as
// the field lists they are.
type mpWriter struct {
	enc *msgpack.Encoder
	buf *bytes.Buffer // what enc writes to, unbuffered: see ints
	err error
}

func (w *mpWriter) do(err error) {
	if w.err == nil {
		w.err = err
	}
}

func (w *mpWriter) arrayLen(n int)    { w.do(w.enc.EncodeArrayLen(n)) }
func (w *mpWriter) mapLen(n int)      { w.do(w.enc.EncodeMapLen(n)) }
func (w *mpWriter) str(s string)      { w.do(w.enc.EncodeString(s)) }
func (w *mpWriter) float64(f float64) { w.do(w.enc.EncodeFloat64(f)) }
func (w *mpWriter) uint(u uint64)     { w.do(w.enc.EncodeUint(u)) }
func (w *mpWriter) nil()              { w.do(w.enc.EncodeNil()) }
func (w *mpWriter) key(k string)      { w.str(k) }
func (w *mpWriter) optStr(s string)   { w.optional(s != "", func() { w.str(s) }) }
func (w *mpWriter) optUint(u *uint64) { w.optional(u != nil, func() { w.uint(*u) }) }
func (w *mpWriter) optLoRAID(id int)  { w.optional(id != 0, func() { w.uint(uint64(id)) }) }
func (w *mpWriter) optional(ok bool, f func()) {
	if ok {
		f()
		return
	}
	w.nil()
}

func (w *mpWriter) uints(us []uint64) {
	w.arrayLen(len(us))
	for _, u := range us {
		w.uint(u)
	}
}

// ints writes a token list. Its elements are appended to the buffer
// directly, in the shortest form EncodeUint would choose (the encoder does
// not buffer, so the bytes land in order): one encoder call per token cost
// the simulated replica more than its hashing.
func (w *mpWriter) ints(is []int) {
	w.arrayLen(len(is))
	b := w.buf.AvailableBuffer()
	for _, i := range is {
		switch u := uint64(i); {
		case u <= 0x7f:
			b = append(b, byte(u))
		case u <= 0xff:
			b = append(b, 0xcc, byte(u))
		case u <= 0xffff:
			b = binary.BigEndian.AppendUint16(append(b, 0xcd), uint16(u))
		case u <= 0xffffffff:
			b = binary.BigEndian.AppendUint32(append(b, 0xce), uint32(u))
		default:
			b = binary.BigEndian.AppendUint64(append(b, 0xcf), u)
		}
	}
	w.buf.Write(b)
}

func (w *mpWriter) extraKeys(eks [][]any) {
	w.arrayLen(len(eks))
	for _, ek := range eks {
		if ek == nil {
			w.nil()
			continue
		}
		w.arrayLen(len(ek))
		for _, k := range ek {
			w.str(fmt.Sprint(k))
		}
	}
}

func hasExtraKeys(eks [][]any) bool {
	for _, ek := range eks {
		if ek != nil {
			return true
		}
	}
	return false
}

// eventArray writes the positional form. Trailing defaulted fields are left
// out as msgspec's omit_defaults does; extra_keys is sent only when a block
// has some, so the common case is exactly the 8-element BlockStored.
func (w *mpWriter) eventArray(ev event) {
	switch e := ev.(type) {
	case blockStored:
		n := 8
		withEK := hasExtraKeys(e.extraKeys)
		if withEK {
			n = 9
		}
		w.arrayLen(n)
		w.str("BlockStored")
		w.uints(e.hashes)
		w.optUint(e.parent)
		w.ints(e.tokens)
		w.uint(uint64(e.blockSize))
		w.optLoRAID(e.loraID)
		w.str(mediumGPU)
		w.optStr(e.loraName)
		if withEK {
			w.extraKeys(e.extraKeys)
		}
	case blockRemoved:
		w.arrayLen(3)
		w.str("BlockRemoved")
		w.uints(e.hashes)
		w.str(mediumGPU)
	case allBlocksCleared:
		w.arrayLen(1)
		w.str("AllBlocksCleared")
	}
}

// eventMap writes the keyed form in msgspec's field order, matching the
// captured v0.26.0 batch in VLLM_EVENTS.md: nil-able fields always present,
// extra_keys one entry per block, group_idx and kv_cache_spec_kind set.
func (w *mpWriter) eventMap(ev event) {
	switch e := ev.(type) {
	case blockStored:
		w.mapLen(11)
		w.key("type")
		w.str("BlockStored")
		w.key("block_hashes")
		w.uints(e.hashes)
		w.key("parent_block_hash")
		w.optUint(e.parent)
		w.key("token_ids")
		w.ints(e.tokens)
		w.key("block_size")
		w.uint(uint64(e.blockSize))
		w.key("lora_id")
		w.optLoRAID(e.loraID)
		w.key("medium")
		w.str(mediumGPU)
		w.key("lora_name")
		w.optStr(e.loraName)
		w.key("extra_keys")
		w.extraKeys(e.extraKeys)
		w.key("group_idx")
		w.uint(0)
		w.key("kv_cache_spec_kind")
		w.str("full_attention")
	case blockRemoved:
		w.mapLen(4)
		w.key("type")
		w.str("BlockRemoved")
		w.key("block_hashes")
		w.uints(e.hashes)
		w.key("medium")
		w.str(mediumGPU)
		w.key("group_idx")
		w.uint(0)
	case allBlocksCleared:
		w.mapLen(1)
		w.key("type")
		w.str("AllBlocksCleared")
	}
}
