package kvroute

import (
	"encoding/binary"
	"strconv"
	"unsafe"

	"github.com/cespare/xxhash/v2"
)

// BlockKey is the router's own 64-bit key for one full block of tokens. It is
// chained: it covers every token before the block too, so a key is unique to
// its position and a flat key -> holders map behaves like a radix tree.
//
// kvroute never reproduces an engine's hash (that depends on the engine's
// hash algorithm, PYTHONHASHSEED and version); it derives these keys from
// token IDs, the same way for engine events and for incoming requests.
type BlockKey uint64

// NoParent marks the first block of a prompt in an IndexOp. A real key equal
// to it would need a 2^-64 hash collision.
const NoParent BlockKey = 0

// String renders the key the way the store names it: signed decimal, so that
// Redis keeps sets of keys as compact intsets.
func (k BlockKey) String() string { return strconv.FormatInt(int64(k), 10) }

// ParseBlockKey reads what String wrote.
func ParseBlockKey(s string) (BlockKey, error) {
	v, err := strconv.ParseInt(s, 10, 64)
	return BlockKey(v), err
}

// KeySpace is what separates caches that must never share a block: the
// model, the LoRA adapter, and a deployment seed. Two requests in different
// key spaces share no key even when their tokens are equal.
type KeySpace struct {
	Model string
	LoRA  string
	Seed  uint64
}

// keyVersion changes if the key derivation ever changes, so that keys from
// two derivations cannot collide silently; testdata/keys.golden pins it.
const keyVersion = "kvroute-key-v1"

// Root is the parent of every prompt's first block in this key space.
func (s KeySpace) Root() BlockKey {
	var e encoder
	e.str(keyVersion)
	e.str(s.Model)
	e.str(s.LoRA)
	e.u64(s.Seed)
	return BlockKey(xxhash.Sum64(e.b))
}

// MMRef names a multimodal item (an image, an audio clip) whose placeholder
// tokens overlap a block. Placeholder tokens are equal for every image, so
// the item's identifier must be part of the key.
type MMRef struct {
	ID     string
	Offset int64
}

// BlockExtra is everything besides its tokens that changes what a block
// means, mirroring vLLM's per-block extra_keys (the LoRA name is not here: it
// is part of the KeySpace and so of every key already).
type BlockExtra struct {
	// Salt is the request's cache_salt; vLLM folds it into block 0 only.
	Salt string
	// MM lists the multimodal items overlapping the block.
	MM []MMRef
	// Other holds any further extra keys (prompt-embeds digests, unknown
	// future kinds) in the order the engine gave them.
	Other []string
}

func (x *BlockExtra) zero() bool { return x.Salt == "" && len(x.MM) == 0 && len(x.Other) == 0 }

// Field tags of the extra-key encoding. Each field is tag, length, bytes, so
// no two different extras serialize to the same bytes.
const (
	tagSalt  = 1
	tagMM    = 2
	tagOther = 3
)

// BlockKeys keys every full block of a prompt. extras[i], when present, is
// block i's extra input; extras may be shorter than the block count or nil.
// The trailing partial block is never keyed: engines only cache full blocks.
func BlockKeys(ks KeySpace, blockSize int, tokens []uint32, extras []BlockExtra) []BlockKey {
	return ChainKeys(nil, ks.Root(), blockSize, tokens, extras)
}

// ChainKeys keys the full blocks of tokens as the continuation of parent
// (a Root or a key already known), appending to dst. An engine event names
// its parent block, so the ingestor continues a chain from there; a request
// starts at the root. Both go through this one function.
func ChainKeys(dst []BlockKey, parent BlockKey, blockSize int, tokens []uint32, extras []BlockExtra) []BlockKey {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	if n == 0 {
		return dst
	}
	if dst == nil {
		dst = make([]BlockKey, 0, n)
	}
	// The fixed part of every block's input (parent, size, tokens) is
	// written in place into one reused buffer; this loop is on the hot path
	// of every decision and runs once per block of the prompt.
	var e encoder
	sz := binary.PutUvarint(make([]byte, binary.MaxVarintLen64), uint64(blockSize))
	fixed := 8 + sz + 4*blockSize
	e.b = make([]byte, fixed, fixed+64)
	binary.PutUvarint(e.b[8:], uint64(blockSize))
	for i := 0; i < n; i++ {
		e.b = e.b[:fixed]
		binary.LittleEndian.PutUint64(e.b, uint64(parent))
		putTokens(e.b[8+sz:fixed], tokens[i*blockSize:(i+1)*blockSize])
		if i < len(extras) && !extras[i].zero() {
			x := &extras[i]
			if x.Salt != "" {
				e.b = append(e.b, tagSalt)
				e.str(x.Salt)
			}
			for _, m := range x.MM {
				e.b = append(e.b, tagMM)
				e.str(m.ID)
				e.u64(uint64(m.Offset))
			}
			for _, o := range x.Other {
				e.b = append(e.b, tagOther)
				e.str(o)
			}
		}
		parent = BlockKey(xxhash.Sum64(e.b))
		dst = append(dst, parent)
	}
	return dst
}

// RequestExtras builds the per-block extras of a request the way vLLM builds
// them for the same request: the cache salt on block 0 only.
func RequestExtras(salt string) []BlockExtra {
	if salt == "" {
		return nil
	}
	return []BlockExtra{{Salt: salt}}
}

type encoder struct{ b []byte }

func (e *encoder) u64(v uint64)     { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *encoder) uvarint(v uint64) { e.b = binary.AppendUvarint(e.b, v) }
func (e *encoder) str(s string) {
	e.uvarint(uint64(len(s)))
	e.b = append(e.b, s...)
}

// littleEndian is true on the machines kvroute runs on (amd64, arm64); there
// a token slice already holds the exact bytes the key is defined over.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()

// putTokens writes tokens as little-endian uint32s into dst (len 4*len(tokens)).
// A plain copy is four times faster than converting token by token.
func putTokens(dst []byte, tokens []uint32) {
	if littleEndian {
		copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), 4*len(tokens)))
		return
	}
	for j, t := range tokens {
		binary.LittleEndian.PutUint32(dst[4*j:], t)
	}
}
