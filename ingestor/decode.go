package ingestor

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"sync"

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
	st := decoders.Get().(*decoder)
	err := st.payload(&b, payload)
	decoders.Put(st)
	if err != nil {
		return Batch{}, &DecodeError{Reason: RejectPayload, Err: err}
	}
	return b, nil
}

// maxDepth bounds nesting so that a hostile payload cannot exhaust the stack.
const maxDepth = 16

var errTooDeep = errors.New("nested too deep")

// decoder reads one payload in a single pass, straight into typed events:
// most of a batch is token ids and hashes, and decoding each event into
// generic values first (map[string]any, []any) made decoding the costliest
// step of ingestion. It drives msgpack's Decoder over a bytes.Reader, which msgpack reads
// without buffering ahead, so the reader's offset is the decoder's: strings
// are sliced from the payload in place, and an event that turns out bad
// half-way is re-read from its start to tell a malformed event (skipped)
// from a payload that is not msgpack (rejected).
type decoder struct {
	d   *msgpack.Decoder
	r   bytes.Reader
	buf []byte
}

var decoders = sync.Pool{New: func() any {
	st := new(decoder)
	st.d = msgpack.NewDecoder(&st.r)
	return st
}}

func (st *decoder) offset() int { return int(st.r.Size()) - st.r.Len() }

func (st *decoder) seek(off int) {
	// Seek within the payload cannot fail.
	_, _ = st.r.Seek(int64(off), io.SeekStart)
}

// fits fails when n elements of at least one byte each cannot follow, so
// that a forged length never sizes an allocation beyond the payload's.
func (st *decoder) fits(n int) error {
	if n > st.r.Len() {
		return io.ErrUnexpectedEOF
	}
	return nil
}

// strBytes reads a str or bin, whose code the caller peeked, as a slice of
// the payload.
func (st *decoder) strBytes() ([]byte, error) {
	n, err := st.d.DecodeBytesLen()
	if err != nil || n <= 0 {
		return nil, err
	}
	if err := st.fits(n); err != nil {
		return nil, err
	}
	off := st.offset()
	st.seek(off + n)
	return st.buf[off : off+n], nil
}

// payload reads the batch: [ts, events, dp_rank?] or
// {"ts", "events", "data_parallel_rank"}.
func (st *decoder) payload(b *Batch, payload []byte) error {
	st.buf = payload
	st.r.Reset(payload)
	defer func() { st.buf = nil; st.r.Reset(nil) }()
	d := st.d
	c, err := d.PeekCode()
	if err != nil {
		return fmt.Errorf("batch: %w", err)
	}
	var ts, rank any
	switch {
	case isArray(c):
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
		if err := st.events(b); err != nil {
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
	case isMap(c):
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
				err = st.events(b)
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
	return nil
}

// events reads the events array (or nil) into b, replacing what an earlier
// "events" key of a map batch left. A bad event is skipped and counted; only
// a payload that is not msgpack at all fails the batch.
func (st *decoder) events(b *Batch) error {
	b.Events, b.Skipped = nil, nil
	n, err := st.d.DecodeArrayLen()
	if err != nil {
		return err
	}
	for i := 0; i < n; i++ {
		start := st.offset()
		ev, reason, err := st.event()
		if err != nil {
			// Nested too deep, or cut short: skip the event whole, which
			// only a structural error can fail.
			st.seek(start)
			if err := st.d.Skip(); err != nil {
				return err
			}
			reason = SkipMalformed
		}
		if reason != "" {
			b.skip(reason)
			continue
		}
		if b.Events == nil {
			// Sized by what the payload can still hold, not by a count
			// it may have forged.
			b.Events = make([]Event, 0, min(n-i, st.r.Len()+1))
		}
		b.Events = append(b.Events, ev)
	}
	return nil
}

// Event fields, in the order their checks run: an event with several bad
// fields is counted under the first one's reason.
const (
	fHashes = iota
	fParent
	fTokens
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtra
	fGroup
	fSpecKind
	nFields

	fNone = -1 // a field decoding ignores
)

// Positional field order of the array encoding (index 0 is the type name);
// kv_cache_spec_sliding_window and anything after are ignored.
var (
	storedFields  = []int{fHashes, fParent, fTokens, fBlockSize, fLoRAID, fMedium, fLoRAName, fExtra, fGroup, fSpecKind}
	removedFields = []int{fHashes, fMedium, fGroup}
)

// fieldOf returns the field a map event's key names, fNone for a key this
// decoder ignores.
func fieldOf(name []byte) int {
	switch string(name) {
	case "block_hashes":
		return fHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokens
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoRAID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoRAName
	case "extra_keys":
		return fExtra
	case "group_idx":
		return fGroup
	case "kv_cache_spec_kind":
		return fSpecKind
	}
	return fNone
}

// kindOf returns the kind an event's type names, 0 for an unknown type.
func kindOf(name []byte) EventKind {
	switch string(name) {
	case "BlockStored":
		return BlockStored
	case "BlockRemoved":
		return BlockRemoved
	case "AllBlocksCleared":
		return AllBlocksCleared
	}
	return 0
}

// fields are one event's fields as read. bad[f] is the skip reason field
// f earned ("" when usable), kept apart so that the verdict follows the
// fixed check order whatever order a map event lists its keys in; a key
// given twice keeps its last value, as a map does. A missing field reads as
// nil.
type fields struct {
	ev  Event
	bad [nFields]string
}

// event reads one event of either encoding. It returns a skip reason for a
// bad event, and an error when the event nests too deep or the payload
// ends: the caller then skips the event whole.
func (st *decoder) event() (Event, string, error) {
	d := st.d
	c, err := d.PeekCode()
	if err != nil {
		return Event{}, "", err
	}
	var f fields
	f.bad[fHashes] = SkipMalformed // missing, as nil, until read
	var kind EventKind
	typed := false // the type is a string (known or not)
	switch {
	case isArray(c):
		n, err := d.DecodeArrayLen()
		if err != nil {
			return Event{}, "", err
		}
		if n == 0 {
			return Event{}, SkipMalformed, nil
		}
		if kind, typed, err = st.typeName(); err != nil {
			return Event{}, "", err
		}
		var order []int
		switch kind {
		case BlockStored:
			order = storedFields
		case BlockRemoved:
			order = removedFields
		}
		for i := 1; i < n; i++ {
			id := fNone
			if i-1 < len(order) {
				id = order[i-1]
			}
			if err := st.field(&f, id); err != nil {
				return Event{}, "", err
			}
		}
	case isMap(c):
		n, err := d.DecodeMapLen()
		if err != nil {
			return Event{}, "", err
		}
		for i := 0; i < n; i++ {
			c, err := d.PeekCode()
			if err != nil {
				return Event{}, "", err
			}
			if !msgpcode.IsString(c) {
				// Entries with non-string keys are ignored.
				if err := walk(d, 1); err != nil {
					return Event{}, "", err
				}
				if err := walk(d, 1); err != nil {
					return Event{}, "", err
				}
				continue
			}
			key, err := st.strBytes()
			if err != nil {
				return Event{}, "", err
			}
			if string(key) == "type" {
				kind, typed, err = st.typeName()
			} else {
				err = st.field(&f, fieldOf(key))
			}
			if err != nil {
				return Event{}, "", err
			}
		}
	default:
		// A scalar, string or extension where an event belongs.
		if err := walk(d, 0); err != nil {
			return Event{}, "", err
		}
		return Event{}, SkipMalformed, nil
	}
	if !typed {
		return Event{}, SkipMalformed, nil
	}
	var ev Event
	var reason string
	switch kind {
	case BlockStored:
		ev, reason = f.stored()
	case BlockRemoved:
		ev, reason = f.removed()
	case AllBlocksCleared:
		ev = Event{Kind: AllBlocksCleared}
	default:
		reason = SkipUnknownType
	}
	return ev, reason, nil
}

// typeName reads an event's type; typed is false when it is not a string.
func (st *decoder) typeName() (kind EventKind, typed bool, err error) {
	c, err := st.d.PeekCode()
	if err != nil {
		return 0, false, err
	}
	if !msgpcode.IsString(c) {
		return 0, false, walk(st.d, 1)
	}
	name, err := st.strBytes()
	return kindOf(name), true, err
}

// stored returns the BlockStored event f holds, or the skip reason of its
// first bad field.
func (f *fields) stored() (Event, string) {
	for _, id := range []int{fHashes, fParent, fTokens, fBlockSize} {
		if f.bad[id] != "" {
			return Event{}, f.bad[id]
		}
	}
	ev := f.ev
	if len(ev.TokenIDs) > 0 {
		// Keys are derived from tokens: a count that does not match the
		// hashes would shift every key after it.
		if ev.BlockSize == 0 || len(ev.TokenIDs) != len(ev.BlockHashes)*ev.BlockSize {
			return Event{}, SkipTokenCount
		}
	}
	for _, id := range []int{fLoRAID, fMedium, fLoRAName, fExtra, fGroup, fSpecKind} {
		if f.bad[id] != "" {
			return Event{}, f.bad[id]
		}
	}
	ev.Kind = BlockStored
	return ev, ""
}

// removed returns the BlockRemoved event f holds, or the skip reason of its
// first bad field; the fields a BlockRemoved does not carry are ignored.
func (f *fields) removed() (Event, string) {
	for _, id := range []int{fHashes, fMedium, fGroup} {
		if f.bad[id] != "" {
			return Event{}, f.bad[id]
		}
	}
	return Event{Kind: BlockRemoved, BlockHashes: f.ev.BlockHashes, Medium: f.ev.Medium,
		HasGroup: f.ev.HasGroup, GroupIdx: f.ev.GroupIdx}, ""
}

// field reads the value of field id (fNone: a value to step over) into f.
// Values are one level below the event.
func (st *decoder) field(f *fields, id int) error {
	d, ev := st.d, &f.ev
	if id == fNone {
		return walk(d, 1)
	}
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	f.bad[id] = ""
	if c == msgpcode.Nil && id != fHashes {
		// nil is the default of every field but block_hashes.
		switch id {
		case fParent:
			ev.HasParent, ev.Parent = false, 0
		case fTokens:
			ev.TokenIDs = nil
		case fBlockSize:
			ev.BlockSize = 0
		case fLoRAID:
			ev.HasLoRAID, ev.LoRAID = false, 0
		case fMedium:
			ev.Medium = ""
		case fLoRAName:
			ev.LoRAName = ""
		case fExtra:
			ev.ExtraKeys = nil
		case fGroup:
			ev.HasGroup, ev.GroupIdx = false, 0
		case fSpecKind:
			ev.SpecKind = ""
		}
		return d.DecodeNil()
	}
	var ok bool
	switch id {
	case fHashes:
		ev.BlockHashes, f.bad[id], err = st.hashes()
		return err
	case fParent:
		ev.Parent, ok, err = st.hash(1)
		ev.HasParent = ok
		if !ok {
			f.bad[id] = SkipBadHash
		}
		return err
	case fTokens:
		ev.TokenIDs, f.bad[id], err = st.tokens()
		return err
	case fBlockSize:
		var n int64
		n, ok, err = st.int(1)
		ev.BlockSize = int(n)
		ok = ok && n >= 0 && n <= 1<<20
	case fLoRAID:
		ev.LoRAID, ok, err = st.int(1)
		ev.HasLoRAID = ok
	case fGroup:
		ev.GroupIdx, ok, err = st.int(1)
		ev.HasGroup = ok
	case fMedium:
		ev.Medium, ok, err = st.optString()
	case fLoRAName:
		ev.LoRAName, ok, err = st.optString()
	case fSpecKind:
		ev.SpecKind, ok, err = st.optString()
	case fExtra:
		ev.ExtraKeys, ok, err = st.extraKeys()
	}
	if !ok {
		f.bad[id] = SkipMalformed
	}
	return err
}

// hashes reads block_hashes: a list of engine hashes, else the event is
// malformed; a list with an unusable hash has a bad hash.
func (st *decoder) hashes() ([]uint64, string, error) {
	return list(st, SkipBadHash, func() (uint64, bool, error) { return st.hash(2) })
}

// list reads a list whose elements are T: plain unsigned integers through
// the fast path (uints), anything else through elem, which reports whether
// the element is usable. A value that is not a list makes the event
// malformed; an unusable element earns it reason.
func list[T uint32 | uint64](st *decoder, reason string, elem func() (T, bool, error)) ([]T, string, error) {
	c, err := st.d.PeekCode()
	if err != nil {
		return nil, "", err
	}
	if !isArray(c) {
		return nil, SkipMalformed, walk(st.d, 1)
	}
	n, err := st.d.DecodeArrayLen()
	if err != nil {
		return nil, "", err
	}
	if err := st.fits(n); err != nil {
		return nil, "", err
	}
	out := make([]T, n)
	bad := ""
	for i := 0; ; i++ {
		// The fast path stops at anything else; msgpack reads that one.
		if i += uints(st, out[i:]); i == n {
			return out, bad, nil
		}
		v, ok, err := elem()
		if err != nil {
			return nil, "", err
		}
		if !ok {
			bad = reason
		}
		out[i] = v
	}
}

// hash reads one engine hash at depth: integers of any width (negative
// ones reinterpreted as their two's complement), or bytes/str digests of
// which the last 8 bytes are read big-endian, as vLLM does for its int
// form. ok is false for anything else, which is stepped over.
func (st *decoder) hash(depth int) (h uint64, ok bool, err error) {
	d := st.d
	c, err := d.PeekCode()
	if err != nil {
		return 0, false, err
	}
	switch {
	case isInt(c):
		n, err := d.DecodeInt64()
		return uint64(n), err == nil, err
	case c == msgpcode.Uint64:
		u, err := d.DecodeUint64()
		return u, err == nil, err
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		b, err := st.strBytes()
		if err != nil {
			return 0, false, err
		}
		h, ok := digestTail(b)
		return h, ok, nil
	}
	return 0, false, walk(d, depth)
}

// tokens reads token_ids: a list of ids in uint32 range, else the event is
// malformed.
func (st *decoder) tokens() ([]uint32, string, error) {
	return list(st, SkipMalformed, func() (uint32, bool, error) {
		t, ok, err := st.int(2)
		if !ok || t < 0 || t > math.MaxUint32 {
			return 0, false, err
		}
		return uint32(t), true, err
	})
}

// uints reads into out, in place, the values ahead that are unsigned
// integers that fit a T, in any of msgpack's unsigned forms (fixint, uint8
// to uint64): the forms of nearly every token id and engine hash. It
// returns how many it read, stopping at any other value, or a truncated
// one, which the caller then reads through msgpack. Going through msgpack's
// byte-at-a-time reader cost several times more than the rest of decoding
// together.
func uints[T uint32 | uint64](st *decoder, out []T) int {
	max := uint64(^T(0))
	b, p := st.buf, st.offset()
	i := 0
	for ; i < len(out) && p < len(b); i++ {
		switch c := b[p]; {
		case c <= msgpcode.PosFixedNumHigh:
			out[i], p = T(c), p+1
		case c == msgpcode.Uint8 && p+2 <= len(b):
			out[i], p = T(b[p+1]), p+2
		case c == msgpcode.Uint16 && p+3 <= len(b):
			out[i], p = T(binary.BigEndian.Uint16(b[p+1:])), p+3
		case c == msgpcode.Uint32 && p+5 <= len(b):
			out[i], p = T(binary.BigEndian.Uint32(b[p+1:])), p+5
		case c == msgpcode.Uint64 && p+9 <= len(b) && binary.BigEndian.Uint64(b[p+1:]) <= max:
			out[i], p = T(binary.BigEndian.Uint64(b[p+1:])), p+9
		default:
			st.seek(p)
			return i
		}
	}
	st.seek(p)
	return i
}

// int reads a count or id at depth: any integer up to MaxInt64, or an
// integral float below 2^53. ok is false for anything else, which is
// stepped over.
func (st *decoder) int(depth int) (n int64, ok bool, err error) {
	d := st.d
	c, err := d.PeekCode()
	if err != nil {
		return 0, false, err
	}
	switch {
	case isInt(c):
		n, err := d.DecodeInt64()
		return n, err == nil, err
	case c == msgpcode.Uint64:
		u, err := d.DecodeUint64()
		return int64(u), err == nil && u <= math.MaxInt64, err
	case c == msgpcode.Float || c == msgpcode.Double:
		x, err := d.DecodeFloat64()
		if err != nil || x != math.Trunc(x) || math.Abs(x) >= 1<<53 {
			return 0, false, err
		}
		return int64(x), true, nil
	}
	return 0, false, walk(d, depth)
}

// optString reads a str or bin field; ok is false for anything else. The
// values vLLM repeats in every event are not copied.
func (st *decoder) optString() (s string, ok bool, err error) {
	c, err := st.d.PeekCode()
	if err != nil {
		return "", false, err
	}
	if !msgpcode.IsString(c) && !msgpcode.IsBin(c) {
		return "", false, walk(st.d, 1)
	}
	b, err := st.strBytes()
	switch string(b) {
	case "GPU":
		return "GPU", true, err
	case "CPU":
		return "CPU", true, err
	case "full_attention":
		return "full_attention", true, err
	}
	return string(b), true, err
}

// extraKeys reads extra_keys: per block nil, a list of items, or a bare
// item where a list belongs (kept as one item rather than losing what it
// says about the block).
func (st *decoder) extraKeys() ([][]ExtraKey, bool, error) {
	d := st.d
	c, err := d.PeekCode()
	if err != nil {
		return nil, false, err
	}
	if !isArray(c) {
		return nil, false, walk(d, 1)
	}
	n, err := d.DecodeArrayLen()
	if err != nil {
		return nil, false, err
	}
	if err := st.fits(n); err != nil {
		return nil, false, err
	}
	out := make([][]ExtraKey, n)
	for i := range out {
		c, err := d.PeekCode()
		if err != nil {
			return nil, false, err
		}
		switch {
		case c == msgpcode.Nil:
			err = d.DecodeNil()
		case isArray(c):
			var m int
			if m, err = d.DecodeArrayLen(); err != nil {
				return nil, false, err
			}
			if err := st.fits(m); err != nil {
				return nil, false, err
			}
			keys := make([]ExtraKey, m)
			for j := range keys {
				if keys[j], err = st.extraKey(3); err != nil {
					return nil, false, err
				}
			}
			out[i] = keys
		default:
			var k ExtraKey
			k, err = st.extraKey(2)
			out[i] = []ExtraKey{k}
		}
		if err != nil {
			return nil, false, err
		}
	}
	return out, true, nil
}

// extraKey reads one extra_keys item at depth; the plain kinds directly,
// anything else through the generic walk, rendered by extraKeyOf.
func (st *decoder) extraKey(depth int) (ExtraKey, error) {
	d := st.d
	c, err := d.PeekCode()
	if err != nil {
		return ExtraKey{}, err
	}
	switch {
	case msgpcode.IsString(c) || msgpcode.IsBin(c):
		b, err := st.strBytes()
		kind := ExtraString
		if msgpcode.IsBin(c) {
			kind = ExtraBytes
		}
		return ExtraKey{Kind: kind, Str: string(b)}, err
	case isInt(c):
		n, err := d.DecodeInt64()
		return ExtraKey{Kind: ExtraInt, Int: n}, err
	}
	v, err := decodeValue(d, depth)
	if err != nil {
		return ExtraKey{}, err
	}
	return extraKeyOf(v), nil
}

func isArray(c byte) bool {
	return msgpcode.IsFixedArray(c) || c == msgpcode.Array16 || c == msgpcode.Array32
}

func isMap(c byte) bool {
	return msgpcode.IsFixedMap(c) || c == msgpcode.Map16 || c == msgpcode.Map32
}

// isInt reports the integer codes that fit an int64 whatever their value
// (uint64 does not).
func isInt(c byte) bool {
	return msgpcode.IsFixedNum(c) || c == msgpcode.Int8 || c == msgpcode.Int16 || c == msgpcode.Int32 || c == msgpcode.Int64 ||
		c == msgpcode.Uint8 || c == msgpcode.Uint16 || c == msgpcode.Uint32
}

// walk steps over one value at depth, failing with errTooDeep if it nests
// deeper than maxDepth: what decodeValue would refuse makes an event
// malformed even where its content is ignored.
func walk(d *msgpack.Decoder, depth int) error {
	if depth > maxDepth {
		return errTooDeep
	}
	c, err := d.PeekCode()
	if err != nil {
		return err
	}
	n := 0
	switch {
	case isArray(c):
		if n, err = d.DecodeArrayLen(); err != nil {
			return err
		}
	case isMap(c):
		if n, err = d.DecodeMapLen(); err != nil {
			return err
		}
		n *= 2
	default:
		return d.Skip()
	}
	for i := 0; i < n; i++ {
		if err := walk(d, depth+1); err != nil {
			return err
		}
	}
	return nil
}

// decodeValue reads any msgpack value into nil, bool, int64, uint64 (only
// above MaxInt64), float64, string, []byte, []any or map[string]any (entries
// with non-string keys are dropped). It reads what the typed path has no
// use for: the batch's ts and rank, a map batch's keys, unusual extra keys.
func decodeValue(d *msgpack.Decoder, depth int) (any, error) {
	if depth > maxDepth {
		return nil, errTooDeep
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
	case isInt(c):
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
	case isArray(c):
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
	case isMap(c):
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
