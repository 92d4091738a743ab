package store

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"strings"
)

// Request ids carry their model, so that Advance and Release find a
// lease's keys (all in its model's slot) from the id alone: a decision
// writes nothing outside its model's hash tag, and under Redis Cluster no
// shard takes a write from every decision in the fleet.
//
// The form is <unique>.<model in unpadded base64url>: the part after the
// last dot names the model (base64url has no dot), the rest only has to be
// unique. Ids are URL-path safe, so they travel in the API's paths as is.

// NewRequestID mints a request id for a decision on model: 128 random bits
// in hex, then the model.
func NewRequestID(model string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return RequestID(model, hex.EncodeToString(b[:]))
}

// RequestID returns the request id of model whose unique part is unique
// (tests mint deterministic ids with it). unique must be unique among
// model's outstanding requests.
func RequestID(model, unique string) string {
	return unique + "." + base64.RawURLEncoding.EncodeToString([]byte(model))
}

// RequestModel returns the model a request id was minted for; ok is false
// for an id not minted by NewRequestID or RequestID (an old-format id).
func RequestModel(id string) (model string, ok bool) {
	i := strings.LastIndexByte(id, '.')
	if i < 0 || i == len(id)-1 {
		return "", false
	}
	b, err := base64.RawURLEncoding.DecodeString(id[i+1:])
	if err != nil || len(b) == 0 {
		return "", false
	}
	return string(b), true
}

// NewRequestID is the package's NewRequestID: the router mints the ids
// of its decisions with it when its index is a Store.
func (s *Store) NewRequestID(model string) string { return NewRequestID(model) }
