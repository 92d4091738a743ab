package vllmtest

import (
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/fxamacker/cbor/v2"
)

// DefaultHashSeed is the seed vLLM hashes into NONE_HASH when it runs with
// --prefix-caching-hash-algo sha256_cbor and a fixed seed. Any other value
// plays the role of PYTHONHASHSEED (e.g. "0").
const DefaultHashSeed = "vllm-none-hash"

// Digest is one engine block hash: the full sha256 digest that chains into
// the next block's hash.
type Digest [32]byte

// Uint64 is the form events carry by default
// (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1): the last 8 bytes read big-endian.
func (d Digest) Uint64() uint64 { return binary.BigEndian.Uint64(d[24:]) }

// hasher reproduces vLLM's sha256_cbor block hashing
// (vllm/v1/core/kv_cache_utils.py): NONE_HASH = H(seed) and
// hash_i = H((hash_{i-1} or NONE_HASH, tuple(tokens_i), extra_keys_i)),
// where H(x) = sha256(cbor2.dumps(x, canonical=True)). It is deliberately
// independent of kvroute's own block keys so that the router is tested
// against the engine's hashes, never against its own.
type hasher struct {
	em   cbor.EncMode
	none Digest
}

func newHasher(seed string) (*hasher, error) {
	em, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		return nil, fmt.Errorf("cbor mode: %w", err)
	}
	h := &hasher{em: em}
	b, err := em.Marshal(seed)
	if err != nil {
		return nil, fmt.Errorf("cbor seed: %w", err)
	}
	h.none = sha256.Sum256(b)
	return h, nil
}

// block hashes one full block. A nil parent means the block starts a prompt
// and chains from NONE_HASH; extra is nil or the block's extra keys.
func (h *hasher) block(parent *Digest, tokens []int, extra []any) (Digest, error) {
	p := h.none
	if parent != nil {
		p = *parent
	}
	for _, t := range tokens {
		if t < 0 {
			return Digest{}, fmt.Errorf("negative token id %d", t)
		}
	}
	if len(extra) == 0 {
		// The common block, [parent, tokens, null], encoded here: the
		// library's reflection cost more than the hash itself, and the
		// replicas' hashing competes with the ingestor in benchmarks.
		// TestBlockEncoding keeps it byte-identical to the library's.
		var buf [64 + 9*64]byte // room for 64 tokens without growing
		return sha256.Sum256(appendBlock(buf[:0], p, tokens)), nil
	}
	toks := make([]uint64, len(tokens))
	for i, t := range tokens {
		toks[i] = uint64(t)
	}
	b, err := h.em.Marshal([]any{p[:], toks, extra})
	if err != nil {
		return Digest{}, fmt.Errorf("cbor block: %w", err)
	}
	return sha256.Sum256(b), nil
}

// appendBlock appends the canonical CBOR of [parent, tokens, null] (vLLM
// passes None when a block has no extra keys): an array of three, a 32-byte
// string, an array of unsigned integers, each in its shortest form.
func appendBlock(b []byte, parent Digest, tokens []int) []byte {
	b = append(b, 0x83)
	b = appendHead(b, 2, 32)
	b = append(b, parent[:]...)
	b = appendHead(b, 4, uint64(len(tokens)))
	for _, t := range tokens {
		b = appendHead(b, 0, uint64(t))
	}
	return append(b, 0xf6)
}

// appendHead appends a CBOR item head of major type major and argument v in
// the shortest encoding, as canonical CBOR requires.
func appendHead(b []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(b, m|byte(v))
	case v <= 0xff:
		return append(b, m|24, byte(v))
	case v <= 0xffff:
		return binary.BigEndian.AppendUint16(append(b, m|25), uint16(v))
	case v <= 0xffffffff:
		return binary.BigEndian.AppendUint32(append(b, m|26), uint32(v))
	}
	return binary.BigEndian.AppendUint64(append(b, m|27), v)
}

// extraKeys is what vLLM folds into a block's hash besides its tokens
// (generate_block_hash_extra_keys): the LoRA name on every block, then the
// cache salt on block 0 only. Multimodal and prompt-embeds keys do not exist
// here.
func extraKeys(block int, lora, salt string) []any {
	var ek []any
	if lora != "" {
		ek = append(ek, lora)
	}
	if block == 0 && salt != "" {
		ek = append(ek, salt)
	}
	return ek
}

// chain hashes every full block of tokens.
func (h *hasher) chain(blockSize int, tokens []int, lora, salt string) ([]Digest, [][]any, error) {
	n := len(tokens) / blockSize
	ds := make([]Digest, 0, n)
	eks := make([][]any, 0, n)
	var parent *Digest
	for i := 0; i < n; i++ {
		ek := extraKeys(i, lora, salt)
		d, err := h.block(parent, tokens[i*blockSize:(i+1)*blockSize], ek)
		if err != nil {
			return nil, nil, err
		}
		ds = append(ds, d)
		eks = append(eks, ek)
		parent = &ds[len(ds)-1]
	}
	return ds, eks, nil
}

// EngineHashes returns the uint64 engine hashes vLLM (sha256_cbor, the given
// seed) would publish for the full blocks of tokens. lora and cacheSalt may be
// empty. Tests use it to predict the event stream without running a replica.
func EngineHashes(seed string, blockSize int, tokens []int, lora, cacheSalt string) ([]uint64, error) {
	if blockSize <= 0 {
		return nil, fmt.Errorf("replica: block size %d", blockSize)
	}
	h, err := newHasher(seed)
	if err != nil {
		return nil, fmt.Errorf("replica: %w", err)
	}
	return h.engineHashes(blockSize, tokens, lora, cacheSalt)
}

// engineHashes is chain in the uint64 form events carry.
func (h *hasher) engineHashes(blockSize int, tokens []int, lora, salt string) ([]uint64, error) {
	ds, _, err := h.chain(blockSize, tokens, lora, salt)
	if err != nil {
		return nil, fmt.Errorf("replica: %w", err)
	}
	out := make([]uint64, len(ds))
	for i, d := range ds {
		out[i] = d.Uint64()
	}
	return out, nil
}
