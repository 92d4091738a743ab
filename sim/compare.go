package sim

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"

	"github.com/kvroute/kvroute/scoring"
)

// Compare replays w once per policy, each with base's weights, in parallel.
// Reports come back in policy order and do not depend on the parallelism.
func Compare(ctx context.Context, cfg Config, base scoring.Config, policies []scoring.Policy, w Workload) ([]Report, error) {
	cfgs := make([]scoring.Config, len(policies))
	for i, p := range policies {
		cfgs[i] = base
		cfgs[i].Policy = p
	}
	return runAll(ctx, cfg, cfgs, w)
}

// runAll runs one replay per scoring config on up to GOMAXPROCS goroutines.
func runAll(ctx context.Context, cfg Config, cfgs []scoring.Config, w Workload) ([]Report, error) {
	out := make([]Report, len(cfgs))
	errs := make([]error, len(cfgs))
	jobs := make(chan int)
	var wg sync.WaitGroup
	for range min(runtime.GOMAXPROCS(0), len(cfgs)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				out[i], errs[i] = Run(ctx, cfg, cfgs[i], w)
			}
		}()
	}
	for i := range cfgs {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// ParsePolicies reads a comma-separated policy list.
func ParsePolicies(s string) ([]scoring.Policy, error) {
	var out []scoring.Policy
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		p, err := scoring.ParsePolicy(f)
		if err != nil {
			return nil, err
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("sim: no policy given")
	}
	return out, nil
}

// ParseWeights applies "name=value,..." to base, naming fields by their
// scoring.Config JSON names (overlap_credit, credit_decay,
// prefill_load_scale, decode_request_weight, host_weight, approx_weight,
// balance_abs, balance_rel, cache_threshold, virtual_nodes). The word
// "dynamo" resets every weight to Dynamo's defaults (scoring.DynamoConfig),
// so "dynamo,overlap_credit=2" compares against Dynamo's other weights.
func ParseWeights(base scoring.Config, s string) (scoring.Config, error) {
	c := base
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if f == "dynamo" {
			c = scoring.DynamoConfig()
			c.Policy = base.Policy
			continue
		}
		name, val, ok := strings.Cut(f, "=")
		if !ok {
			return c, fmt.Errorf("sim: weight %q: want name=value", f)
		}
		name = strings.TrimSpace(name)
		if name == "virtual_nodes" {
			v, err := strconv.Atoi(strings.TrimSpace(val))
			if err != nil {
				return c, fmt.Errorf("sim: weight %s: %w", name, err)
			}
			c.VirtualNodes = v
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			return c, fmt.Errorf("sim: weight %s: %w", name, err)
		}
		ptr := map[string]*float64{
			"overlap_credit": &c.OverlapCredit, "credit_decay": &c.CreditDecay,
			"prefill_load_scale": &c.PrefillLoadScale, "decode_request_weight": &c.DecodeRequestWeight,
			"host_weight": &c.HostWeight, "approx_weight": &c.ApproxWeight, "predict_weight": &c.PredictWeight,
			"balance_abs": &c.BalanceAbs, "balance_rel": &c.BalanceRel, "cache_threshold": &c.CacheThreshold,
		}[name]
		if ptr == nil {
			return c, fmt.Errorf("sim: unknown weight %q", name)
		}
		*ptr = v
	}
	return c, c.Validate()
}

// WriteTable prints one row per report.
func WriteTable(w io.Writer, reports []Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\thit%\tphantom%\tTTFT p50 ms\tTTFT p99 ms\tE2E p50 ms\tE2E p99 ms\tmakespan s\tKV CV 0.5s\treq CV 0.5s\treq CV run\tsticky%\t")
	for _, r := range reports {
		fmt.Fprintf(tw, "%s\t%.1f\t%.1f\t%.0f\t%.0f\t%.0f\t%.0f\t%.1f\t%.3f\t%.3f\t%.3f\t%.1f\t\n",
			r.Policy, 100*r.HitRate, 100*r.PhantomHitRate, r.TTFT.P50, r.TTFT.P99, r.E2E.P50, r.E2E.P99,
			r.MakespanS, r.DecodeBlockCVBinned, r.LoadCVBinned, r.LoadCV, 100*r.Stickiness)
	}
	return tw.Flush()
}
