package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"sync"

	"github.com/vmihailenco/msgpack/v5"
	"github.com/vmihailenco/msgpack/v5/msgpcode"
)

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
