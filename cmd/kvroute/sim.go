package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/sim"
)

// simOutput is `kvroute sim --json`: stable, documented in sim/README.md.
type simOutput struct {
	Workload string           `json:"workload"`
	Requests int              `json:"requests"`
	Config   sim.Config       `json:"config"`
	Reports  []sim.Report     `json:"reports"`
	Sweep    *sim.SweepResult `json:"sweep,omitempty"`
}

// runSim is `kvroute sim`: replay a trace or a named workload against
// policies and print the comparison (and optionally a weight sweep).
func runSim(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	def := sim.DefaultConfig()
	var (
		trace     = fs.String("trace", "", "Mooncake-format JSONL trace `file`")
		workload  = fs.String("workload", "", "built-in workload: herding, stale or agentic")
		replicas  = fs.Int("replicas", def.Replicas, "number of replicas (1..64)")
		policies  = fs.String("policies", "kv,hard-switch,session,least-load,round-robin,pure-affinity", "comma-separated policies")
		weights   = fs.String("weights", "", "kv weights, e.g. overlap_credit=2,credit_decay=0.5,prefill_load_scale=1,host_weight=0.75; \"dynamo\" starts from Dynamo's defaults")
		capacity  = fs.Int("capacity", def.CapacityBlocks, "KV cache per replica, in blocks of the workload's block size")
		prefill   = fs.Float64("prefill-tps", def.PrefillTPS, "prefill tokens/s per replica")
		decode    = fs.Float64("decode-tps", def.DecodeTPS, "decode tokens/s per running request")
		slowdown  = fs.Float64("decode-slowdown", 0, "bandwidth-bound decode: per-request rate is decode-tps/(1+slowdown*share of cache held by decoding requests); 0 keeps it fixed")
		batch     = fs.Int("max-batch", def.MaxBatch, "running requests per replica")
		delay     = fs.Duration("event-delay", def.EventDelay, "cache event delivery delay")
		loss      = fs.Float64("event-loss", 0, "probability an event batch is lost")
		booking   = fs.String("decode-booking", sim.BookOutput, "router's decode booking: output (output blocks still owed, as the service books) or active (prompt+output blocks, Dynamo's active blocks)")
		dropRm    = fs.Bool("drop-removals", false, "never deliver removal events (stale index)")
		blockTok  = fs.Int("block-tokens", 512, "tokens per trace hash_id")
		timeScale = fs.Float64("time-scale", 1, "multiply trace timestamps (0.5 = twice as fast)")
		limit     = fs.Int("limit", 0, "replay only the first N trace requests")
		seed      = fs.Uint64("seed", 1, "random seed")
		asJSON    = fs.Bool("json", false, "print JSON instead of a table")
		svgPath   = fs.String("svg", "", "write the chart (hit rate against TTFT p99, load per replica over time) to `file`; none unless given")
		sweep     = fs.Bool("sweep", false, "sweep kv weights and report the best by --objective")
		predict   = fs.Bool("predict", true, "let bookings write predicted entries and the kv cost count them (false: predict_weight=0, as before predictions)")
		objective = fs.String("objective", "ttft_p99", "sweep objective: ttft_p99, ttft_p50, e2e_p99, makespan")
		top       = fs.Int("top", 10, "sweep rows to print")
		prioShare = fs.String("priority-share", "", "tag a seeded fraction `F[:P]` of the requests with priority P (default -1, the rest 0); a trace's own priority fields win")
		tenants   = fs.String("tenants", "", "share the requests between tenants in proportion to their weights, `NAME=W,NAME=W`; a trace's own tenant fields win")
		model     = fs.String("model", "", "the simulated fleet's model `name`, whose --model-limits apply")
	)
	adm := addAdmissionFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	admCfg, err := adm.config()
	if err != nil {
		return err
	}
	tag := sim.Tagging{Seed: *seed}
	if *prioShare != "" {
		if tag.PriorityShare, tag.Priority, err = sim.ParsePriorityShare(*prioShare); err != nil {
			return fmt.Errorf("--priority-share: %w", err)
		}
	}
	if tag.Tenants, err = sim.ParseTenants(*tenants); err != nil {
		return fmt.Errorf("--tenants: %w", err)
	}
	if (*trace == "") == (*workload == "") {
		return errors.New("sim: give exactly one of --trace or --workload")
	}
	var w sim.Workload
	if *trace != "" {
		f, err := os.Open(*trace)
		if err != nil {
			return err
		}
		w, err = sim.LoadMooncake(f, sim.MooncakeOptions{BlockTokens: *blockTok, TimeScale: *timeScale, Limit: *limit})
		f.Close()
		if err != nil {
			return err
		}
	} else {
		switch *workload {
		case "herding":
			w = sim.Herding(48, 3, *seed)
		case "stale":
			w = sim.StaleIndex(*seed, time.Second)
		case "agentic":
			w = sim.Agentic(sim.AgenticOptions{Seed: *seed})
		default:
			return fmt.Errorf("sim: unknown workload %q (want herding, stale or agentic)", *workload)
		}
	}
	if err := w.Tag(tag); err != nil {
		return err
	}
	cfg := sim.Config{
		Replicas: *replicas, CapacityBlocks: *capacity, PrefillTPS: *prefill, DecodeTPS: *decode, DecodeSlowdown: *slowdown,
		MaxBatch: *batch, EventDelay: *delay, EventLoss: *loss, DropRemovals: *dropRm, DecodeBooking: *booking, Seed: *seed,
		Admission: admCfg, Model: *model,
	}
	if err := cfg.Validate(); err != nil {
		return err
	}
	base, err := sim.ParseWeights(scoring.DefaultConfig(), *weights)
	if err != nil {
		return err
	}
	if !*predict {
		base.PredictWeight = 0
	}
	pols, err := sim.ParsePolicies(*policies)
	if err != nil {
		return err
	}
	reports, err := sim.Compare(ctx, cfg, base, pols, w)
	if err != nil {
		return err
	}
	out := simOutput{Workload: w.Name, Requests: len(w.Requests), Config: cfg, Reports: reports}
	if *sweep {
		s, err := sim.Sweep(ctx, cfg, base, sim.DefaultGrid(), *objective, w)
		if err != nil {
			return err
		}
		out.Sweep = &s
	}
	if *svgPath != "" {
		f, err := os.Create(*svgPath)
		if err != nil {
			return err
		}
		if err := sim.WriteSVG(f, reports); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(out)
	}
	fmt.Fprintf(stdout, "%s: %d requests on %d replicas (capacity %d blocks, prefill %.0f tok/s, decode %.0f tok/s)\n",
		w.Name, len(w.Requests), cfg.Replicas, cfg.CapacityBlocks, cfg.PrefillTPS, cfg.DecodeTPS)
	if err := sim.WriteTable(stdout, reports); err != nil {
		return err
	}
	if err := writeAdmission(stdout, reports); err != nil {
		return err
	}
	if out.Sweep != nil {
		fmt.Fprintln(stdout)
		if err := sim.WriteSweep(stdout, *out.Sweep, *top); err != nil {
			return err
		}
	}
	if *svgPath != "" {
		fmt.Fprintf(stdout, "chart: %s\n", *svgPath)
	}
	return nil
}

// writeAdmission prints the admission table after the policy table, when
// admission acted in the run.
func writeAdmission(w io.Writer, reports []sim.Report) error {
	for _, r := range reports {
		if r.Admission != nil {
			fmt.Fprintln(w)
			return sim.WriteAdmission(w, reports)
		}
	}
	return nil
}
