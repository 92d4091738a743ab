// Package admission is kvroute's admission policy, pure: when a replica
// has room (HasRoom), in what order queued requests are admitted (Queue,
// the reference the store's Lua queue is held to and the simulator's
// queue), and the limits that bound it (Config). It does no I/O.
package admission

import (
	"fmt"
	"time"

	"github.com/kvroute/kvroute"
)

// Config is the admission policy of one fleet. The zero value admits
// everything at once (no limit, no queue): admission is on only when
// Enabled.
type Config struct {
	// Enabled turns admission on: a request no replica has room for
	// waits in its model's queue instead of being forwarded.
	Enabled bool
	// Limits is every replica's default (kvroute.Replica.Limits overrides
	// it per replica, Models per model).
	Limits kvroute.Limits
	// Models overrides Limits and MaxInFlight per model.
	Models map[string]Model
	// MaxInFlight bounds the requests in flight on a model's whole fleet
	// (0: none but the replicas' own).
	MaxInFlight int64
	// StaleAfter is the age past which an engine's scraped metrics
	// (waiting, KV usage) are stale (0: DefaultStaleAfter).
	StaleAfter time.Duration
	// StaleSaturated counts a replica whose scrape is stale as saturated;
	// false (the default) ignores a stale scrape and limits it by what
	// kvroute booked alone, because a scrape that stops is far more often
	// an ingestor restarting than an engine stuck full.
	StaleSaturated bool
	// QueueLimit, BandLimit and TenantLimit bound the requests queued per
	// model, per band of a model and per tenant of a band (0: the
	// Default* values, for TenantLimit the fair share of a full band;
	// negative: none).
	QueueLimit, BandLimit, TenantLimit int
	// TTL is how long a request may wait when it asks no shorter
	// (0: DefaultTTL).
	TTL time.Duration
	// ColdStart is how long a request for a model with no replica up
	// waits for one before a 503 (0: DefaultColdStart; negative: none).
	ColdStart time.Duration
}

// Model is one model's overrides of Config.
type Model struct {
	Limits      kvroute.Limits
	MaxInFlight int64
}

// The defaults a user with no configuration gets, and why.
const (
	// DefaultStaleAfter is five scrape intervals of the ingestor's
	// default (1 s): one slow scrape is not staleness.
	DefaultStaleAfter = 5 * time.Second
	// DefaultQueueLimit and DefaultBandLimit follow llm-d's 5,000
	// requests per band, with room for two bands' worth per model.
	DefaultQueueLimit = 10000
	DefaultBandLimit  = 5000
	// DefaultTenantLimit (0) is the fair share (ShareOf): no tenant holds
	// more than the band's limit divided among the tenants backlogged in
	// it and one more, so that a band never fills with the tenants
	// already in it and a newcomer always finds room. Fair queuing orders
	// what is queued; without this share a tenant that filled a band
	// would take every place it frees, and the others would be shed as
	// band_full at the door.
	DefaultTenantLimit = 0
	// DefaultTTL is llm-d's request TTL: past a minute a client has
	// usually given up.
	DefaultTTL = 60 * time.Second
	// DefaultColdStart is how long a model's first replica takes to load
	// a small model from a warm node; longer waits need --cold-start.
	DefaultColdStart = 60 * time.Second
)

// Validate refuses limits that could never admit anything.
func (c Config) Validate() error {
	if err := validLimits("limits", c.Limits); err != nil {
		return err
	}
	for m, o := range c.Models {
		if err := validLimits("model "+m+" limits", o.Limits); err != nil {
			return err
		}
		if o.MaxInFlight < 0 {
			return fmt.Errorf("admission: model %s: max in flight %d is negative", m, o.MaxInFlight)
		}
	}
	if c.MaxInFlight < 0 {
		return fmt.Errorf("admission: max in flight %d is negative", c.MaxInFlight)
	}
	if c.StaleAfter < 0 || c.TTL < 0 {
		return fmt.Errorf("admission: stale-after and ttl must not be negative")
	}
	return nil
}

func validLimits(what string, l kvroute.Limits) error {
	if l.MaxRequests < 0 || l.MaxPrefillTokens < 0 || l.MaxWaiting < 0 {
		return fmt.Errorf("admission: %s: a limit is negative", what)
	}
	if l.MaxKVUsage < 0 || l.MaxKVUsage > 1 {
		return fmt.Errorf("admission: %s: max KV usage %g is not in [0, 1]", what, l.MaxKVUsage)
	}
	return nil
}

// LimitsFor returns a replica's limits: its own over its model's over the
// default.
func (c Config) LimitsFor(r kvroute.Replica) kvroute.Limits {
	l := c.Limits
	if m, ok := c.Models[r.Model]; ok {
		l = l.Over(m.Limits)
	}
	if r.Limits != nil {
		l = l.Over(*r.Limits)
	}
	return l
}

// MaxInFlightFor returns a model's fleet limit (0: none).
func (c Config) MaxInFlightFor(model string) int64 {
	if m, ok := c.Models[model]; ok && m.MaxInFlight != 0 {
		return m.MaxInFlight
	}
	return c.MaxInFlight
}

// StaleAge returns StaleAfter or its default.
func (c Config) StaleAge() time.Duration {
	if c.StaleAfter == 0 {
		return DefaultStaleAfter
	}
	return c.StaleAfter
}

// Queue limits resolved: 0 means none.
func (c Config) QueueMax() int  { return orDefault(c.QueueLimit, DefaultQueueLimit) }
func (c Config) BandMax() int   { return orDefault(c.BandLimit, DefaultBandLimit) }
func (c Config) TenantMax() int { return orDefault(c.TenantLimit, DefaultTenantLimit) }

// FairShare reports whether tenants are bounded by their fair share of a
// band (TenantLimit 0, the default) rather than by a fixed limit.
func (c Config) FairShare() bool { return c.TenantLimit == 0 }

// ShareOf is a tenant's fair share of a band whose limit is bandMax when
// others other tenants are backlogged in it: bandMax over others + 2
// (itself, and room for one more), rounded up; 0 is no limit.
func ShareOf(bandMax, others int) int {
	if bandMax <= 0 {
		return 0
	}
	k := max(others, 0) + 2
	return (bandMax + k - 1) / k
}

func orDefault(v, d int) int {
	switch {
	case v < 0:
		return 0
	case v == 0:
		return d
	}
	return v
}

// TTLOrDefault returns TTL or its default.
func (c Config) TTLOrDefault() time.Duration {
	if c.TTL == 0 {
		return DefaultTTL
	}
	return c.TTL
}

// ColdStartWait returns how long a request waits for a model's first
// replica (0: it does not).
func (c Config) ColdStartWait() time.Duration {
	switch {
	case c.ColdStart < 0:
		return 0
	case c.ColdStart == 0:
		return DefaultColdStart
	}
	return c.ColdStart
}

// HasRoom reports whether a replica whose load is l may be given one more
// request under lim: every limit set is not yet reached. blockSize turns
// booked prefill blocks into tokens. The engine's waiting and KV usage
// count only while the scrape is fresh (now - l.ScrapedAt within
// staleAfter); a stale one counts as room, or as saturated when
// staleSaturated. A replica never scraped has no engine figures to
// count. The store's Lua (lua/admit.lua, room) is held to this function.
func HasRoom(l kvroute.Load, lim kvroute.Limits, blockSize int, now time.Time, staleAfter time.Duration, staleSaturated bool) bool {
	if lim.MaxRequests > 0 && l.Requests >= lim.MaxRequests {
		return false
	}
	if lim.MaxPrefillTokens > 0 && l.PrefillBlocks*int64(blockSize) >= lim.MaxPrefillTokens {
		return false
	}
	if lim.MaxWaiting == 0 && lim.MaxKVUsage == 0 || l.ScrapedAt.IsZero() {
		return true
	}
	if now.Sub(l.ScrapedAt) > staleAfter {
		return !staleSaturated
	}
	if lim.MaxWaiting > 0 && l.Waiting >= lim.MaxWaiting {
		return false
	}
	if lim.MaxKVUsage > 0 && l.KVUsage >= lim.MaxKVUsage {
		return false
	}
	return true
}
