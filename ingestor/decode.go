package ingestor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/cespare/xxhash/v2"
	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

// EventKind is the type of one vLLM KV-cache event.
type EventKind uint8

const (
	// BlockStored says the engine now holds full blocks (possibly on an
	// offload medium).
	BlockStored EventKind = iota + 1
	// BlockRemoved says one physical copy of each named block is gone.
	BlockRemoved
	// AllBlocksCleared says the engine reset its prefix cache.
	AllBlocksCleared
)

func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// ExtraKind says what one item of a block's extra_keys was on the wire. The
// translator needs it to tell a cache salt from a multimodal identifier.
type ExtraKind uint8

const (
	// ExtraString is a msgpack str: the LoRA name, an old-style multimodal
	// identifier, or the cache salt.
	ExtraString ExtraKind = iota + 1
	// ExtraBytes is a msgpack bin (prompt-embeds digests).
	ExtraBytes
	// ExtraInt is an integer (the LoRA id of old versions).
	ExtraInt
	// ExtraPair is a newer multimodal [identifier, offset] pair.
	ExtraPair
	// ExtraOther is anything else, rendered as text so that it still
	// changes the key.
	ExtraOther
)

// ExtraKey is one item of a block's extra_keys.
type ExtraKey struct {
	Kind ExtraKind
	// Str is the string, the raw bytes, the pair's identifier, or a
	// rendering of an unknown item.
	Str string
	// Int is the integer item or the pair's offset.
	Int int64
}

// Event is one decoded vLLM event. Fields an event type does not carry are
// zero. Decoding keeps every well-formed event; deciding what to index
// (hybrid groups, offload tiers) is the translator's job, since it needs
// per-replica state.
type Event struct {
	Kind EventKind
	// BlockHashes are engine hashes in chain order, normalized to uint64
	// (bytes hashes: the last 8 bytes, big-endian).
	BlockHashes []uint64
	// HasParent is false when the first block starts a prompt.
	HasParent bool
	Parent    uint64
	// TokenIDs are the tokens of all blocks, concatenated; empty for
	// offload events, which only say a known hash lives on Medium too.
	TokenIDs  []uint32
	BlockSize int
	// HasLoRAID and LoRAID carry the deprecated integer adapter id.
	HasLoRAID bool
	LoRAID    int64
	// Medium is "" when the event said nil (GPU).
	Medium   string
	LoRAName string
	// ExtraKeys has one entry per block; a nil entry means no extra keys.
	ExtraKeys [][]ExtraKey
	// HasGroup is false when the event did not carry group_idx.
	HasGroup bool
	GroupIdx int64
	// SpecKind is kv_cache_spec_kind, "" when absent.
	SpecKind string
}

// Batch is one decoded ZeroMQ message: one engine step's events.
type Batch struct {
	Topic  string
	Seq    uint64
	TS     float64
	DPRank *int
	// Digest is a hash of the payload bytes. A replay sends a batch's
	// exact bytes again, so a different digest under the same seq means a
	// different (restarted) publisher.
	Digest uint64
	Events []Event
	// Skipped counts events left out of Events, by reason (see Skip*).
	Skipped map[string]int
}

func (b *Batch) skip(reason string) {
	if b.Skipped == nil {
		b.Skipped = make(map[string]int)
	}
	b.Skipped[reason]++
}

// Reasons an event is skipped while the rest of its batch is kept.
const (
	SkipUnknownType = "unknown_type"
	SkipMalformed   = "malformed"
	SkipBadHash     = "bad_hash"
	SkipTokenCount  = "token_count"
)

// Reasons a whole message is rejected.
const (
	RejectFrames  = "frames"
	RejectSeq     = "seq"
	RejectPayload = "payload"
	RejectReplay  = "replay"
)

// DecodeError rejects a whole message; Reason is one of the Reject*
// constants and labels the decode-error metric.
type DecodeError struct {
	Reason string
	Err    error
}

func (e *DecodeError) Error() string { return "decode: " + e.Reason + ": " + e.Err.Error() }
func (e *DecodeError) Unwrap() error { return e.Err }

// ReasonOf returns the rejection reason of err, or "other".
func ReasonOf(err error) string {
	var de *DecodeError
	if errors.As(err, &de) {
		return de.Reason
	}
	return "other"
}

func reject(reason, format string, args ...any) error {
	return &DecodeError{Reason: reason, Err: fmt.Errorf(format, args...)}
}

// EndSeq is the sequence number of the replay end marker.
const EndSeq = math.MaxUint64

// Decode decodes one live message [topic, seq, payload]. A message that is
// not three frames, whose seq frame is not 8 bytes, or whose payload is not a
// batch is rejected whole; inside a good batch, unknown and malformed events
// are skipped and counted in Batch.Skipped.
func Decode(frames [][]byte) (Batch, error) {
	if len(frames) != 3 {
		return Batch{}, reject(RejectFrames, "want 3 frames, got %d", len(frames))
	}
	return decodeParts(frames[0], frames[1], frames[2])
}

// ReplayMsg is one decoded reply from a replica's replay socket.
type ReplayMsg struct {
	// End is true for the end marker; Batch is then empty.
	End   bool
	Batch Batch
}

// DecodeReplay decodes one message a DEALER receives from the replay ROUTER.
// Current vLLM sends ["", topic, seq8, payload] and ends with
// ["", "", 0xff…ff, ""]; versions before PR #45177 leave out the topic
// (["", seq8, payload], end ["", 0xff…ff, ""]). The two are told apart by
// frame count.
func DecodeReplay(frames [][]byte) (ReplayMsg, error) {
	var topic, seq, payload []byte
	switch len(frames) {
	case 4:
		topic, seq, payload = frames[1], frames[2], frames[3]
	case 3:
		// Either ["", seq, payload] or, should a transport ever drop the
		// empty delimiter, [topic, seq, payload]: both read the same way.
		topic, seq, payload = frames[0], frames[1], frames[2]
	default:
		return ReplayMsg{}, reject(RejectFrames, "replay: want 3 or 4 frames, got %d", len(frames))
	}
	if len(seq) != 8 {
		return ReplayMsg{}, reject(RejectSeq, "replay: seq frame is %d bytes", len(seq))
	}
	if binary.BigEndian.Uint64(seq) == EndSeq {
		return ReplayMsg{End: true}, nil
	}
	b, err := decodeParts(topic, seq, payload)
	if err != nil {
		return ReplayMsg{}, err
	}
	return ReplayMsg{Batch: b}, nil
}

func decodeParts(topic, seq, payload []byte) (Batch, error) {
	if len(seq) != 8 {
		return Batch{}, reject(RejectSeq, "seq frame is %d bytes", len(seq))
	}
	b := Batch{Topic: string(topic), Seq: binary.BigEndian.Uint64(seq), Digest: xxhash.Sum64(payload) | 1}
	if err := decodePayload(&b, payload); err != nil {
		return Batch{}, &DecodeError{Reason: RejectPayload, Err: err}
	}
	return b, nil
}

// maxDepth bounds nesting so that a hostile payload cannot exhaust the stack.
const maxDepth = 16

// decodePayload reads the batch: [ts, events, dp_rank?] or
// {"ts", "events", "data_parallel_rank"}. Each event is first taken as raw
// bytes so that one bad event cannot spoil its neighbours.
func decodePayload(b *Batch, payload []byte) error {
	d := msgpack.NewDecoder(bytes.NewReader(payload))
	c, err := d.PeekCode()
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	var ts, rank any
	var events []msgpack.RawMessage
	switch {
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil {
			return fmt.Errorf("batch: %w", err)
		}
		if n < 2 {
			return fmt.Errorf("batch: array of %d elements", n)
		}
		if ts, err = decodeValue(d, 0); err != nil {
			return fmt.Errorf("batch ts: %w", err)
		}
		if events, err = decodeRawList(d); err != nil {
			return fmt.Errorf("batch events: %w", err)
		}
		if n >= 3 {
			if rank, err = decodeValue(d, 0); err != nil {
				return fmt.Errorf("batch rank: %w", err)
			}
		}
		for i := 3; i < n; i++ {
			if err := d.Skip(); err != nil {
				return fmt.Errorf("batch: %w", err)
			}
		}
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil {
			return fmt.Errorf("batch: %w", err)
		}
		seen := false
		for i := 0; i < n; i++ {
			k, err := decodeValue(d, 0)
			if err != nil {
				return fmt.Errorf("batch key: %w", err)
			}
			switch k {
			case "ts":
				ts, err = decodeValue(d, 0)
			case "events":
				events, err = decodeRawList(d)
				seen = true
			case "data_parallel_rank":
				rank, err = decodeValue(d, 0)
			default:
				err = d.Skip()
			}
			if err != nil {
				return fmt.Errorf("batch %v: %w", k, err)
			}
		}
		if !seen {
			return errors.New("batch: no events")
		}
	default:
		return fmt.Errorf("batch: unexpected msgpack code %#x", c)
	}
	if f, ok := asFloat(ts); ok {
		b.TS = f
	} else if ts != nil {
		return fmt.Errorf("batch ts: %T", ts)
	}
	if r, ok := asInt(rank); ok && r >= 0 && r <= math.MaxInt32 {
		ri := int(r)
		b.DPRank = &ri
	}
	for _, raw := range events {
		ev, reason := decodeEvent(raw)
		if reason != "" {
			b.skip(reason)
			continue
		}
		b.Events = append(b.Events, ev)
	}
	return nil
}

// decodeRawList reads an array (or nil) as its elements' raw bytes.
func decodeRawList(d *msgpack.Decoder) ([]msgpack.RawMessage, error) {
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, nil
	}
	out := make([]msgpack.RawMessage, 0, min(n, 1024))
	for i := 0; i < n; i++ {
		raw, err := d.DecodeRaw()
		if err != nil {
			return nil, err
		}
		out = append(out, raw)
	}
	return out, nil
}

// decodeValue reads any msgpack value into nil, bool, int64, uint64 (only
// above MaxInt64), float64, string, []byte, []any or map[string]any (entries
// with non-string keys are dropped). It is the lenient walk every version
// drift goes through.
func decodeValue(d *msgpack.Decoder, depth int) (any, error) {
	if depth > maxDepth {
		return nil, errors.New("nested too deep")
	}
	c, err := d.PeekCode()
	if err != nil {
		return nil, err
	}
	switch {
	case c == msgpcode.Nil:
		return nil, d.DecodeNil()
	case c == msgpcode.True || c == msgpcode.False:
		return d.DecodeBool()
	case msgpcode.IsFixedNum(c) || c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64 ||
		c == msgpcode.Uint8 || c == msgpcode.Uint16 || c == msgpcode.Uint32:
		return d.DecodeInt64()
	case c == msgpcode.Uint64:
		u, err := d.DecodeUint64()
		if err != nil {
			return nil, err
		}
		if u <= math.MaxInt64 {
			return int64(u), nil
		}
		return u, nil
	case c == msgpcode.Float || c == msgpcode.Double:
		return d.DecodeFloat64()
	case msgpcode.IsString(c):
		return d.DecodeString()
	case msgpcode.IsBin(c):
		return d.DecodeBytes()
	case msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32:
		n, err := d.DecodeArrayLen()
		if err != nil || n < 0 {
			return nil, err
		}
		out := make([]any, 0, min(n, 1024))
		for i := 0; i < n; i++ {
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			out = append(out, v)
		}
		return out, nil
	case msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32:
		n, err := d.DecodeMapLen()
		if err != nil || n < 0 {
			return nil, err
		}
		out := make(map[string]any, min(n, 64))
		for i := 0; i < n; i++ {
			k, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			v, err := decodeValue(d, depth+1)
			if err != nil {
				return nil, err
			}
			if ks, ok := k.(string); ok {
				out[ks] = v
			}
		}
		return out, nil
	default:
		// Extensions and anything newer: skip over it, keep it as opaque.
		if err := d.Skip(); err != nil {
			return nil, err
		}
		return opaque{}, nil
	}
}

// opaque stands for a value of a kind this decoder does not interpret.
type opaque struct{}

// Positional field order of the array encoding (index 0 is the type name).
var (
	storedFields  = []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window"}
	removedFields = []string{"block_hashes", "medium", "group_idx"}
)

// decodeEvent decodes one event, either encoding. It returns a skip reason
// instead of an error: a bad event is counted, never fatal.
func decodeEvent(raw msgpack.RawMessage) (Event, string) {
	d := msgpack.NewDecoder(bytes.NewReader(raw))
	v, err := decodeValue(d, 0)
	if err != nil {
		return Event{}, SkipMalformed
	}
	var typ string
	fields := map[string]any{}
	switch x := v.(type) {
	case []any:
		if len(x) == 0 {
			return Event{}, SkipMalformed
		}
		s, ok := x[0].(string)
		if !ok {
			return Event{}, SkipMalformed
		}
		typ = s
		var names []string
		switch typ {
		case "BlockStored":
			names = storedFields
		case "BlockRemoved":
			names = removedFields
		}
		for i, name := range names {
			if i+1 < len(x) {
				fields[name] = x[i+1]
			}
		}
	case map[string]any:
		s, ok := x["type"].(string)
		if !ok {
			return Event{}, SkipMalformed
		}
		typ, fields = s, x
	default:
		return Event{}, SkipMalformed
	}
	switch typ {
	case "BlockStored":
		return decodeStored(fields)
	case "BlockRemoved":
		return decodeRemoved(fields)
	case "AllBlocksCleared":
		return Event{Kind: AllBlocksCleared}, ""
	}
	return Event{}, SkipUnknownType
}

func decodeStored(f map[string]any) (Event, string) {
	ev := Event{Kind: BlockStored}
	var reason string
	if ev.BlockHashes, reason = hashList(f["block_hashes"]); reason != "" {
		return Event{}, reason
	}
	if p := f["parent_block_hash"]; p != nil {
		h, ok := hashOf(p)
		if !ok {
			return Event{}, SkipBadHash
		}
		ev.HasParent, ev.Parent = true, h
	}
	switch t := f["token_ids"].(type) {
	case nil:
	case []any:
		ev.TokenIDs = make([]uint32, len(t))
		for i, x := range t {
			n, ok := asInt(x)
			if !ok || n < 0 || n > math.MaxUint32 {
				return Event{}, SkipMalformed
			}
			ev.TokenIDs[i] = uint32(n)
		}
	default:
		return Event{}, SkipMalformed
	}
	if bs := f["block_size"]; bs != nil {
		n, ok := asInt(bs)
		if !ok || n < 0 || n > 1<<20 {
			return Event{}, SkipMalformed
		}
		ev.BlockSize = int(n)
	}
	if len(ev.TokenIDs) > 0 {
		// Keys are derived from tokens: a count that does not match the
		// hashes would shift every key after it.
		if ev.BlockSize == 0 || len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
			return Event{}, SkipTokenCount
		}
	}
	if id := f["lora_id"]; id != nil {
		n, ok := asInt(id)
		if !ok {
			return Event{}, SkipMalformed
		}
		ev.HasLoRAID, ev.LoRAID = true, n
	}
	var ok bool
	if ev.Medium, ok = optString(f["medium"]); !ok {
		return Event{}, SkipMalformed
	}
	if ev.LoRAName, ok = optString(f["lora_name"]); !ok {
		return Event{}, SkipMalformed
	}
	switch ek := f["extra_keys"].(type) {
	case nil:
	case []any:
		ev.ExtraKeys = make([][]ExtraKey, len(ek))
		for i, blk := range ek {
			switch items := blk.(type) {
			case nil:
			case []any:
				keys := make([]ExtraKey, 0, len(items))
				for _, it := range items {
					keys = append(keys, extraKeyOf(it))
				}
				ev.ExtraKeys[i] = keys
			default:
				// A bare scalar where a list belongs: keep it as one item
				// rather than lose what it says about the block.
				ev.ExtraKeys[i] = []ExtraKey{extraKeyOf(items)}
			}
		}
	default:
		return Event{}, SkipMalformed
	}
	if g := f["group_idx"]; g != nil {
		n, ok := asInt(g)
		if !ok {
			return Event{}, SkipMalformed
		}
		ev.HasGroup, ev.GroupIdx = true, n
	}
	if ev.SpecKind, ok = optString(f["kv_cache_spec_kind"]); !ok {
		return Event{}, SkipMalformed
	}
	return ev, ""
}

func decodeRemoved(f map[string]any) (Event, string) {
	ev := Event{Kind: BlockRemoved}
	var reason string
	if ev.BlockHashes, reason = hashList(f["block_hashes"]); reason != "" {
		return Event{}, reason
	}
	var ok bool
	if ev.Medium, ok = optString(f["medium"]); !ok {
		return Event{}, SkipMalformed
	}
	if g := f["group_idx"]; g != nil {
		n, ok := asInt(g)
		if !ok {
			return Event{}, SkipMalformed
		}
		ev.HasGroup, ev.GroupIdx = true, n
	}
	return ev, ""
}

func hashList(v any) ([]uint64, string) {
	l, ok := v.([]any)
	if !ok {
		return nil, SkipMalformed
	}
	out := make([]uint64, len(l))
	for i, x := range l {
		h, ok := hashOf(x)
		if !ok {
			return nil, SkipBadHash
		}
		out[i] = h
	}
	return out, ""
}

// hashOf normalizes an engine hash: integers of any width (negative ones
// reinterpreted as their two's complement), or bytes/str digests of which
// the last 8 bytes are read big-endian, as vLLM does for its int form.
func hashOf(v any) (uint64, bool) {
	switch x := v.(type) {
	case int64:
		return uint64(x), true
	case uint64:
		return x, true
	case []byte:
		return digestTail(x)
	case string:
		return digestTail([]byte(x))
	}
	return 0, false
}

func digestTail(b []byte) (uint64, bool) {
	if len(b) == 0 {
		return 0, false
	}
	if len(b) >= 8 {
		return binary.BigEndian.Uint64(b[len(b)-8:]), true
	}
	var buf [8]byte
	copy(buf[8-len(b):], b)
	return binary.BigEndian.Uint64(buf[:]), true
}

func extraKeyOf(v any) ExtraKey {
	switch x := v.(type) {
	case string:
		return ExtraKey{Kind: ExtraString, Str: x}
	case []byte:
		return ExtraKey{Kind: ExtraBytes, Str: string(x)}
	case int64:
		return ExtraKey{Kind: ExtraInt, Int: x}
	case uint64:
		return ExtraKey{Kind: ExtraOther, Str: strconv.FormatUint(x, 10)}
	case []any:
		if len(x) == 2 {
			off, ok := asInt(x[1])
			switch id := x[0].(type) {
			case string:
				if ok {
					return ExtraKey{Kind: ExtraPair, Str: id, Int: off}
				}
			case []byte:
				if ok {
					return ExtraKey{Kind: ExtraPair, Str: string(id), Int: off}
				}
			}
		}
	}
	return ExtraKey{Kind: ExtraOther, Str: fmt.Sprint(v)}
}

func asInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int64:
		return x, true
	case uint64:
		return 0, false // above MaxInt64: not a count
	case float64:
		if x == math.Trunc(x) && math.Abs(x) < 1<<53 {
			return int64(x), true
		}
	}
	return 0, false
}

func asFloat(v any) (float64, bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	}
	return 0, false
}

// optString reads an optional string; nil is "".
func optString(v any) (string, bool) {
	switch x := v.(type) {
	case nil:
		return "", true
	case string:
		return x, true
	case []byte:
		return string(x), true
	}
	return "", false
}
