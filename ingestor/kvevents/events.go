// Package kvevents decodes the KV-cache events a vLLM engine publishes on
// its ZeroMQ sockets (vLLM calls them KV events): the live messages
// [topic, seq, msgpack batch] and the replies of its replay socket, in every
// layout vLLM has shipped (positional-array and map events, replies with and
// without a topic). It knows neither sockets nor the index: the ingestor
// receives the frames, and translates the typed events this package returns
// into index operations.
//
// Decoding is lenient where vLLM may grow and strict where a mistake would
// corrupt the index: unknown event types and malformed events are skipped
// and counted while the rest of their batch is kept; a message that is not a
// batch at all is rejected whole with a reason that labels a metric.
package kvevents

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/cespare/xxhash/v2"
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
// ingestor's translator needs it to tell a cache salt from a multimodal
// identifier.
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
// (hybrid groups, offload tiers) is the ingestor's job, since it needs
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
	// Topic is the first frame, the publisher's topic: in bind mode it
	// names the replica.
	Topic string
	// Seq is the publisher's sequence number, one per batch, which shows
	// gaps and restarts.
	Seq uint64
	// TS is the engine's timestamp in seconds since the epoch (0 when
	// absent), which event lag is measured against.
	TS float64
	// DPRank is the data-parallel rank, nil when the batch carried none or
	// one out of range.
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

// Reasons an event is skipped while the rest of its batch is kept; they key
// Batch.Skipped and label the ingestor's skipped-events metric.
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
