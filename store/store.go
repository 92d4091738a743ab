// Package store keeps all of kvroute's routing state in Redis: the block
// index fed by engine events, approximate entries for replicas that publish
// none, per-replica load with expiring leases, the replica registry and the
// ingestors' ownership leases. Scoring pods hold nothing that matters, so
// every pod sees the same index and load, and a pod that dies loses nothing.
//
// Every key of one model carries the hash tag {m:<model>}, so each Lua
// script touches a single slot and Redis Cluster spreads models over shards:
// a decision (Lookup, Reserve), its lease's Advance and Release, and an
// event batch each run in their model's slot alone. Every script declares
// its keys in KEYS except the children sets P k:<key>, found while walking
// the tree and built from the declared P blk key. Request ids carry their
// model (NewRequestID: <unique>.<base64url model>), so that Advance and
// Release find the lease's keys from the id. Only two keys are global,
// both read rarely and touched by single-key commands: the registry
// kvr:replicas (cached by the router) and the ingestors' ownership leases
// kvr:own:<name>. Config selects one server, Sentinel or Cluster.
//
// Index data model (P = kvr:{m:<model>}:), chosen so that a lookup costs
// about log2(blocks) reads however many replicas hold the chain:
//
//   - P load      hash: R -> booked load, R#s -> scraped load, R#i -> R's
//     slot (a small int, allocated on R's first store or approximate record,
//     reused after PurgeReplica), #n -> next slot. Slots and loads share a
//     hash so that Lookup reads both with one HMGET.
//   - P blk       hash: block key (8 bytes) -> parent | first child | shape
//     byte | four slot bitmaps RG, RA (rooted: held, with every ancestor, on
//     GPU / in any tier), HG, HA (held on GPU / in any tier), or just one
//     when all four are equal (shape bit 2: the common block, held on GPU
//     by the replicas that hold it rooted); see lua/lib.lua.
//   - P k:<key>   set: children beyond the first (fan-out after shared
//     system prompts).
//   - P r:R:e2r   hash: engine hash -> key (8 bytes) + "gpu,host" refcounts,
//     filed under the hash's first 6 bytes as records of its last 2 bytes,
//     the key, the counts and ';' (nearly always one record: a 6-byte field
//     and a 14-byte value fit jemalloc's 8- and 16-byte classes); R:meta
//     holds the applied seq, time and block count.
//   - P ax        hash: key -> (slot, expiry) pairs of approximate entries,
//     with per-minute sweep lists P axb:<minute> indexed by zset P axq.
//   - P lb, P leases  hash, zset: lease bodies (request id -> replica,
//     prefill, decode, phase) and expiries; P slotfree: purged slots.
//
// RG|RA along a request's chain only shrinks, so lookup.lua finds every
// boundary by a level-batched binary search on string equality and Go
// decodes each candidate's depth from the few boundary bitmaps.
package store

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/metric"
)

// DefaultApproxTTL is how long an approximate entry is trusted: long enough
// to carry a conversation's next turn, short enough that a replica's real
// eviction does not go unnoticed for long.
const DefaultApproxTTL = 10 * time.Minute

// Options configures a Store. The zero value is usable.
type Options struct {
	// Now is the clock; tests inject their own. Nil means time.Now.
	Now func() time.Time
	// Logger receives operational messages; nil discards them, as in
	// every kvroute package.
	Logger *slog.Logger
	// ApproxTTL is the lifetime of approximate entries; zero means
	// DefaultApproxTTL.
	ApproxTTL time.Duration
	// NoLookupHints turns off Lookup's memory of earlier lookups' run ends
	// (see hintCache); answers are the same either way. For benchmarks.
	NoLookupHints bool
	// Reads is the client a lookup's plain reads go to, a replica's (see
	// Config.ReadReplicas and NewReadClient); nil sends them to the
	// primary, with everything else. The Store owns it: Close closes it.
	Reads redis.UniversalClient
}

// Store is kvroute's Redis state. It is safe for concurrent use.
type Store struct {
	c         redis.UniversalClient
	now       func() time.Time
	log       *slog.Logger
	approxTTL time.Duration
	// stop shuts the embedded server down (OpenEmbedded); nil otherwise.
	stop func()
	// slots caches each (model, replica)'s slot, "model\x00replica" -> int,
	// as apply.lua reported it; applyfast.lua verifies it on every use.
	slots sync.Map
	// hints remembers where earlier lookups found runs ending (lookup.go).
	hints   hintCache
	noHints bool
	// fast decides when hinted lookups try plain reads (lookupfast.go).
	fast fastLookup
	// batches coalesces the decision path's commands, one batcher per
	// model: model -> *batcher (batch.go).
	batches sync.Map
	// slotc caches replicas' slots for lookups (slots.go).
	slotc slotCache
	// cluster is set for a Redis Cluster client (domain.go).
	cluster bool
	// reads routes lookup reads to replicas (reads.go); its client is nil
	// when they go to the primary.
	reads replicaReads
	// late limits when a booking may still be made (late.go).
	late lateClock
	// predCount counts predicted entries' outcomes (CountPredictions);
	// nil counts nothing.
	predCount atomic.Pointer[metric.Int64Counter]
}

// New returns a Store over c. The Store owns c: Close closes it.
func New(c redis.UniversalClient, opt Options) *Store {
	_, cluster := c.(*redis.ClusterClient)
	s := &Store{c: c, now: opt.Now, log: opt.Logger, approxTTL: opt.ApproxTTL, noHints: opt.NoLookupHints, cluster: cluster,
		reads: replicaReads{c: opt.Reads}}
	if s.now == nil {
		s.now = time.Now
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.approxTTL <= 0 {
		s.approxTTL = DefaultApproxTTL
	}
	return s
}

// Close closes the Redis client, and stops the embedded server when the
// Store runs one (OpenEmbedded).
func (s *Store) Close() error {
	err := s.c.Close()
	if s.reads.c != nil {
		err = errors.Join(err, s.reads.c.Close())
	}
	if s.stop != nil {
		s.stop()
	}
	return err
}

// Ping checks that Redis answers.
func (s *Store) Ping(ctx context.Context) error {
	return wrap("ping", s.c.Ping(ctx).Err())
}

// wrap prefixes err with the operation and marks connectivity failures with
// kvroute.ErrUnavailable, which callers turn into degraded-mode routing.
func wrap(op string, err error) error {
	if err == nil {
		return nil
	}
	if unavailable(err) {
		return fmt.Errorf("store: %s: %w: %w", op, kvroute.ErrUnavailable, err)
	}
	return fmt.Errorf("store: %s: %w", op, err)
}

// unavailable reports whether err means Redis could not be reached (as
// opposed to Redis rejecting the command).
func unavailable(err error) bool {
	var ne net.Error
	switch {
	case errors.Is(err, redis.ErrClosed), errors.Is(err, redis.ErrPoolTimeout),
		errors.Is(err, redis.ErrPoolExhausted),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF),
		errors.Is(err, net.ErrClosed), errors.Is(err, syscall.ECONNREFUSED),
		errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE),
		errors.Is(err, context.DeadlineExceeded), errors.As(err, &ne):
		return true
	}
	// A server loading its data, a Cluster reconfiguring (a slot unserved,
	// a multi-key command during resharding, a redirect go-redis gave up
	// following), or a primary demoted under us: Redis is there but cannot
	// serve the command now, which the router treats as an outage.
	for _, p := range []string{"LOADING", "CLUSTERDOWN", "MASTERDOWN", "TRYAGAIN", "MOVED", "ASK", "READONLY", "NOREPLICAS"} {
		if redis.HasErrorPrefix(err, p) {
			return true
		}
	}
	// go-redis's own: a cluster client that lost every node, a failover
	// client that reaches no Sentinel.
	msg := err.Error()
	return strings.Contains(msg, "redis: cluster has no nodes") ||
		strings.Contains(msg, "sentinels specified in configuration are unreachable") ||
		strings.Contains(msg, "redis: connection not available")
}

//go:embed lua/*.lua
var luaFS embed.FS

func luaSrc(names ...string) string {
	var b strings.Builder
	for _, n := range names {
		src, err := luaFS.ReadFile("lua/" + n + ".lua")
		if err != nil {
			panic(err)
		}
		b.Write(src)
		b.WriteByte('\n')
	}
	return b.String()
}

// The scripts are run by EVALSHA; go-redis falls back to EVAL (which caches
// the script again) when a restarted or flushed server answers NOSCRIPT.
var (
	scriptApply       = redis.NewScript(luaSrc("lib", "predict", "fence", "apply"))
	scriptApplyF      = redis.NewScript(luaSrc("predict", "fence", "applyfast"))
	scriptSlot        = redis.NewScript(luaSrc("lib", "slot"))
	scriptReset       = redis.NewScript(luaSrc("lib", "fence", "reset"))
	scriptPurge       = redis.NewScript(luaSrc("lib", "purge"))
	scriptLookup      = redis.NewScript(luaSrc("lookup"))
	scriptApprox      = redis.NewScript(luaSrc("lib", "approx"))
	scriptSweepAx     = redis.NewScript(luaSrc("sweepapprox"))
	scriptReserve     = redis.NewScript(luaSrc("admit", "predict", "reserve"))
	scriptReserveBest = redis.NewScript(luaSrc("admit", "predict", "reservebest"))
	scriptAdvance     = redis.NewScript(luaSrc("admit", "predict", "lease", "advance"))
	scriptRelease     = redis.NewScript(luaSrc("admit", "predict", "lease", "release"))
	scriptSweep       = redis.NewScript(luaSrc("admit", "predict", "lease", "sweep"))
	scriptEnqueue     = redis.NewScript(luaSrc("admit", "enqueue"))
	scriptDequeue     = redis.NewScript(luaSrc("admit", "predict", "lease", "dequeue"))
	scriptKick        = redis.NewScript(luaSrc("admit", "predict", "lease", "kick"))
	scriptAcquire     = redis.NewScript(luaSrc("acquire"))
	scriptDisown      = redis.NewScript(luaSrc("disown"))
)

// reservedField reports whether a registry field is not a replica: ids
// cannot hold '#'.
func reservedField(id string) bool { return id == fieldRegVer || id == fieldEpoch }

// Key names. prefix carries the model's hash tag; every per-model key
// starts with it.
// The two global keys are each touched by single-key commands only (the
// registry's MULTI and WATCH name kvr:replicas alone), so in a Cluster no
// command spans slots; every script's keys are one model's.
const (
	keyReplicas = "kvr:replicas"
	fieldRegVer = "#v" // registry version, a field no replica id can take
	fieldEpoch  = "#e" // the store's epoch (epoch.go), another
)

func prefix(model string) string     { return "kvr:{m:" + model + "}:" }
func metaKey(model, r string) string { return prefix(model) + "r:" + r + ":meta" }
func e2rKey(model, r string) string  { return prefix(model) + "r:" + r + ":e2r" }
func blkKey(model string) string     { return prefix(model) + "blk" }
func axKey(model string) string      { return prefix(model) + "ax" }
func axqKey(model string) string     { return prefix(model) + "axq" }
func loadKey(model string) string    { return prefix(model) + "load" }
func lbKey(model string) string      { return prefix(model) + "lb" }
func leasesKey(model string) string  { return prefix(model) + "leases" }
func ownKey(name string) string      { return "kvr:own:" + name }

// axbKey is the sweep list of approximate entries expiring in minute.
func axbKey(model string, minute int64) string {
	return prefix(model) + "axb:" + strconv.FormatInt(minute, 10)
}

// libKeys are the keys lua/lib.lua reads (blk, load, slotfree), followed
// by a script's own.
func libKeys(model string, more ...string) []string {
	return append([]string{blkKey(model), loadKey(model), prefix(model) + "slotfree"}, more...)
}

// leaseKeys are the keys of reserve.lua, lua/lease.lua and lua/admit.lua
// (which every script that books, ends or queues a request includes).
func leaseKeys(model string) []string {
	p := prefix(model)
	return []string{loadKey(model), lbKey(model), leasesKey(model),
		p + "cap", p + "adm", p + "q", p + "qx", p + "qb", depthKey(model)}
}

// depthKey is the list whose length is the model's queue depth.
func depthKey(model string) string { return prefix(model) + "depth" }

func ms(t time.Time) int64 { return t.UnixMilli() }
