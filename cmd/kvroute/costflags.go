package main

import (
	"flag"
	"fmt"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// costFlags are the decision's flags: the policy, the kv cost's weights,
// the block size, and the predicted entries' (DESIGN.md, "Predicted
// entries": their weight in the cost, how long one waits for its
// confirming event, and the engine speed that dates it).
type costFlags struct {
	policy string
	sc     scoring.Config
}

// addCostFlags registers them over rc's values; resolve checks them and
// writes them to rc.
func addCostFlags(fs *flag.FlagSet, rc *router.Config) *costFlags {
	c := &costFlags{sc: rc.Scoring}
	sc := &c.sc
	fs.StringVar(&c.policy, "policy", string(sc.Policy), "routing `policy`: "+policyNames())
	fs.Float64Var(&sc.OverlapCredit, "overlap-credit", sc.OverlapCredit, "prefill blocks one cached block saves (0 disables cache awareness)")
	fs.Float64Var(&sc.CreditDecay, "credit-decay", sc.CreditDecay, "shrinks the overlap credit of replicas carrying excess prefill (anti-herding)")
	fs.Float64Var(&sc.PrefillLoadScale, "prefill-load-scale", sc.PrefillLoadScale, "weight of the prefill term against the decode term")
	fs.Float64Var(&sc.DecodeRequestWeight, "decode-request-weight", sc.DecodeRequestWeight, "blocks charged per active request")
	fs.Float64Var(&sc.HostWeight, "host-weight", sc.HostWeight, "credit of a block cached only in an offload tier, relative to a GPU block (0..1)")
	fs.Float64Var(&sc.PredictWeight, "predict-weight", sc.PredictWeight, "credit of a predicted block (one a booking sent to a replica, its prefill still in flight) relative to a held one when that prefill starts, rising to a whole one when it is due (0..1; 0 turns predicted entries off)")
	fs.DurationVar(&rc.PredictGrace, "predict-grace", router.DefaultPredictGrace, "how long a predicted entry outlives its prefill's due time, waiting for the event that confirms it")
	fs.Float64Var(&rc.PrefillTPS, "prefill-tps", rc.PrefillTPS, "a replica's prefill speed in tokens a second, on the slow side: it bounds load bookings' lives and dates predicted entries' due times")
	fs.IntVar(&rc.BlockSize, "block-size", rc.BlockSize, "tokens per KV block; must match the replicas' --block-size")
	return c
}

func (c *costFlags) resolve(rc *router.Config) error {
	p, err := scoring.ParsePolicy(c.policy)
	if err != nil {
		return fmt.Errorf("--policy: %w", err)
	}
	c.sc.Policy = p
	if err := c.sc.Validate(); err != nil {
		return err
	}
	if rc.BlockSize <= 0 || !(rc.PrefillTPS > 0) || rc.PredictGrace < 0 {
		return fmt.Errorf("--block-size and --prefill-tps must be positive and --predict-grace not negative, got %d, %v, %v", rc.BlockSize, rc.PrefillTPS, rc.PredictGrace)
	}
	rc.Scoring = c.sc
	return nil
}
