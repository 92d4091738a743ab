package main

import (
	"errors"
	"flag"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/admission"
)

// admissionFlags are the admission flags `kvroute serve` and `kvroute
// sim` share, so that a policy tuned in the simulator is the one the
// service runs with the same command line.
type admissionFlags struct {
	enabled                            bool
	limits                             kvroute.Limits
	maxInFlight                        int64
	models                             modelLimits
	queueLimit, bandLimit, tenantLimit int
	ttl, coldStart, staleAfter         time.Duration
	staleSaturated                     bool
}

func addAdmissionFlags(fs *flag.FlagSet) *admissionFlags {
	a := &admissionFlags{models: modelLimits{}}
	fs.BoolVar(&a.enabled, "admission", true, "queue a request no replica has room for (under the --max-* limits) instead of forwarding it; with no limit set nothing ever queues")
	fs.Int64Var(&a.limits.MaxRequests, "max-requests", 0, "requests booked per replica before it has no room, vLLM's --max-num-seqs being the natural value (0: no limit)")
	fs.Int64Var(&a.limits.MaxPrefillTokens, "max-prefill-tokens", 0, "uncached prompt tokens booked per replica and not yet past their first token (0: no limit)")
	fs.Int64Var(&a.limits.MaxWaiting, "max-waiting", 0, "the engine's scraped vllm:num_requests_waiting at which a replica has no room (0: no limit)")
	fs.Float64Var(&a.limits.MaxKVUsage, "max-kv-usage", 0, "the engine's scraped vllm:kv_cache_usage_perc (0..1) at which a replica has no room (0: no limit)")
	fs.Int64Var(&a.maxInFlight, "max-in-flight", 0, "requests in flight on one model's whole fleet (0: no limit but the replicas')")
	fs.Var(a.models, "model-limits", "one model's limits over the defaults, `MODEL:max_requests=N,max_prefill_tokens=N,max_waiting=N,max_kv_usage=F,max_in_flight=N` (any subset); repeatable")
	fs.IntVar(&a.queueLimit, "queue-limit", admission.DefaultQueueLimit, "requests queued per model before more are shed (0: no limit)")
	fs.IntVar(&a.bandLimit, "band-limit", admission.DefaultBandLimit, "requests queued per priority band of a model (0: no limit)")
	fs.IntVar(&a.tenantLimit, "tenant-limit", admission.DefaultTenantLimit, "requests queued per tenant of a band (0: its fair share of a full band, the band's limit over the tenants queued in it)")
	fs.DurationVar(&a.ttl, "queue-ttl", admission.DefaultTTL, "longest a request waits in the queue when it asks no shorter")
	fs.DurationVar(&a.coldStart, "cold-start", admission.DefaultColdStart, "how long a request for a model with no replica up waits for one before a 503 (0: none)")
	fs.DurationVar(&a.staleAfter, "stale-after", admission.DefaultStaleAfter, "age past which a replica's scraped engine metrics (for --max-waiting, --max-kv-usage) are stale")
	fs.BoolVar(&a.staleSaturated, "stale-saturated", false, "count a replica whose scrape is stale as having no room (default: limit it by kvroute's bookings alone)")
	return a
}

// config is the admission.Config the flags describe, validated; errors
// name the flag. A flag's 0 ("no limit", "no wait") becomes the Config's
// negative, since a Config's 0 takes the default the flag already shows.
func (a *admissionFlags) config() (admission.Config, error) {
	l := a.limits
	switch {
	case l.MaxRequests < 0:
		return admission.Config{}, fmt.Errorf("--max-requests %d is negative (0 is no limit)", l.MaxRequests)
	case l.MaxPrefillTokens < 0:
		return admission.Config{}, fmt.Errorf("--max-prefill-tokens %d is negative (0 is no limit)", l.MaxPrefillTokens)
	case l.MaxWaiting < 0:
		return admission.Config{}, fmt.Errorf("--max-waiting %d is negative (0 is no limit)", l.MaxWaiting)
	case !(l.MaxKVUsage >= 0 && l.MaxKVUsage <= 1):
		return admission.Config{}, fmt.Errorf("--max-kv-usage %v is not in 0..1 (0 is no limit)", l.MaxKVUsage)
	case a.maxInFlight < 0:
		return admission.Config{}, fmt.Errorf("--max-in-flight %d is negative", a.maxInFlight)
	case a.queueLimit < 0:
		return admission.Config{}, fmt.Errorf("--queue-limit %d is negative (0 is no limit)", a.queueLimit)
	case a.bandLimit < 0:
		return admission.Config{}, fmt.Errorf("--band-limit %d is negative (0 is no limit)", a.bandLimit)
	case a.tenantLimit < 0:
		return admission.Config{}, fmt.Errorf("--tenant-limit %d is negative (0 is the fair share)", a.tenantLimit)
	case a.ttl <= 0:
		return admission.Config{}, fmt.Errorf("--queue-ttl %v must be positive", a.ttl)
	case a.coldStart < 0:
		return admission.Config{}, fmt.Errorf("--cold-start %v is negative (0 is no wait)", a.coldStart)
	case a.staleAfter <= 0:
		return admission.Config{}, fmt.Errorf("--stale-after %v must be positive", a.staleAfter)
	}
	c := admission.Config{
		Enabled: a.enabled, Limits: a.limits, MaxInFlight: a.maxInFlight,
		QueueLimit: noneIfZero(a.queueLimit), BandLimit: noneIfZero(a.bandLimit), TenantLimit: a.tenantLimit,
		TTL: a.ttl, ColdStart: a.coldStart, StaleAfter: a.staleAfter, StaleSaturated: a.staleSaturated,
	}
	if c.ColdStart == 0 {
		c.ColdStart = -1
	}
	if len(a.models) > 0 {
		c.Models = make(map[string]admission.Model, len(a.models))
		for m, o := range a.models {
			c.Models[m] = o
		}
	}
	if err := c.Validate(); err != nil {
		return admission.Config{}, fmt.Errorf("admission flags: %w", err)
	}
	return c, nil
}

func noneIfZero(v int) int {
	if v == 0 {
		return -1
	}
	return v
}

func checkLimits(model string, l kvroute.Limits) error {
	if l.MaxRequests < 0 || l.MaxPrefillTokens < 0 || l.MaxWaiting < 0 {
		return fmt.Errorf("model %s: a limit is negative (0 is no limit)", model)
	}
	if !(l.MaxKVUsage >= 0 && l.MaxKVUsage <= 1) {
		return fmt.Errorf("model %s: max KV usage %v is not in 0..1", model, l.MaxKVUsage)
	}
	return nil
}

// modelLimits is --model-limits: one model's overrides per value,
// repeatable; a model given twice is refused rather than merged.
type modelLimits map[string]admission.Model

func (m modelLimits) String() string {
	if len(m) == 0 {
		return ""
	}
	return fmt.Sprintf("%d models", len(m))
}

// Set parses MODEL:key=value,...; the model is everything before the last
// colon, so that names such as org/model:tag keep theirs. MODEL: with no
// keys declares the model with no overrides: its requests wait out the
// cold start when it has no replica up.
func (m modelLimits) Set(v string) error {
	i := strings.LastIndex(v, ":")
	if i <= 0 {
		return errors.New("want MODEL:key=value,... (keys max_requests, max_prefill_tokens, max_waiting, max_kv_usage, max_in_flight), or MODEL: to declare a model")
	}
	model := v[:i]
	if _, dup := m[model]; dup {
		return fmt.Errorf("model %q given twice", model)
	}
	var o admission.Model
	if i == len(v)-1 {
		m[model] = o
		return nil
	}
	for _, kv := range strings.Split(v[i+1:], ",") {
		k, val, ok := strings.Cut(strings.TrimSpace(kv), "=")
		if !ok {
			return fmt.Errorf("model %s: %q is not key=value", model, kv)
		}
		var err error
		switch k {
		case "max_requests":
			o.Limits.MaxRequests, err = strconv.ParseInt(val, 10, 64)
		case "max_prefill_tokens":
			o.Limits.MaxPrefillTokens, err = strconv.ParseInt(val, 10, 64)
		case "max_waiting":
			o.Limits.MaxWaiting, err = strconv.ParseInt(val, 10, 64)
		case "max_kv_usage":
			o.Limits.MaxKVUsage, err = strconv.ParseFloat(val, 64)
		case "max_in_flight":
			o.MaxInFlight, err = strconv.ParseInt(val, 10, 64)
		default:
			return fmt.Errorf("model %s: unknown key %q", model, k)
		}
		if err != nil {
			return fmt.Errorf("model %s: %s: %w", model, k, err)
		}
	}
	if err := checkLimits(model, o.Limits); err != nil {
		return err
	}
	if o.MaxInFlight < 0 {
		return fmt.Errorf("model %s: max_in_flight %d is negative", model, o.MaxInFlight)
	}
	m[model] = o
	return nil
}
