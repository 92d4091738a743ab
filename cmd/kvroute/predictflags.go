package main

import (
	"flag"

	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
)

// addPredictFlags registers the predicted entries' flags (DESIGN.md,
// "Predicted entries"): their weight in the kv cost, how long one waits
// for its confirming event, and the engine speed that dates it.
func addPredictFlags(fs *flag.FlagSet, sc *scoring.Config, rc *router.Config) {
	fs.Float64Var(&sc.PredictWeight, "predict-weight", sc.PredictWeight, "credit of a predicted block (one a booking sent to a replica, its prefill still in flight) relative to a held one when that prefill starts, rising to a whole one when it is due (0..1; 0 turns predicted entries off)")
	fs.DurationVar(&rc.PredictGrace, "predict-grace", router.DefaultPredictGrace, "how long a predicted entry outlives its prefill's due time, waiting for the event that confirms it")
	fs.Float64Var(&rc.PrefillTPS, "prefill-tps", rc.PrefillTPS, "a replica's prefill speed in tokens a second, on the slow side: it bounds load bookings' lives and dates predicted entries' due times")
}
