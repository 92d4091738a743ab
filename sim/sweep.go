package sim

import (
	"context"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"

	"github.com/kvroute/kvroute/scoring"
)

// Grid is the kv weights a sweep tries: every combination of the lists.
type Grid struct {
	OverlapCredit    []float64 `json:"overlap_credit"`
	CreditDecay      []float64 `json:"credit_decay"`
	PrefillLoadScale []float64 `json:"prefill_load_scale"`
	// HostWeight only matters for host-tier blocks, which the engine model
	// does not have; the default grid holds it at Dynamo's 0.75.
	HostWeight []float64 `json:"host_weight"`
}

// DefaultGrid is 5 credits × 4 decays × 5 prefill scales.
func DefaultGrid() Grid {
	return Grid{
		OverlapCredit:    []float64{0, 0.5, 1, 2, 4},
		CreditDecay:      []float64{0, 0.5, 1, 2},
		PrefillLoadScale: []float64{0.5, 1, 2, 4, 8},
		HostWeight:       []float64{0.75},
	}
}

// Objectives a sweep can minimize.
var Objectives = []string{"ttft_p99", "ttft_p50", "e2e_p99", "makespan"}

func objective(name string, r Report) (float64, error) {
	switch name {
	case "ttft_p99", "":
		return r.TTFT.P99, nil
	case "ttft_p50":
		return r.TTFT.P50, nil
	case "e2e_p99":
		return r.E2E.P99, nil
	case "makespan":
		return r.MakespanS, nil
	}
	return 0, fmt.Errorf("sim: unknown objective %q (want one of %v)", name, Objectives)
}

// SweepRow is one grid point's outcome.
type SweepRow struct {
	OverlapCredit    float64 `json:"overlap_credit"`
	CreditDecay      float64 `json:"credit_decay"`
	PrefillLoadScale float64 `json:"prefill_load_scale"`
	HostWeight       float64 `json:"host_weight"`
	Objective        float64 `json:"objective"`
	HitRate          float64 `json:"hit_rate"`
	TTFTP99          float64 `json:"ttft_p99_ms"`
	LoadCV           float64 `json:"load_cv"`
	LoadCVBinned     float64 `json:"load_cv_binned"`
	// DecodeBlockCVBinned is the report's field of that name.
	DecodeBlockCVBinned float64 `json:"decode_block_cv_binned"`
}

// SweepResult ranks the grid by the objective, best first; ties go to the
// higher hit rate, then to grid order. Best is the winner's full report.
type SweepResult struct {
	Objective string     `json:"objective"`
	Grid      Grid       `json:"grid"`
	Rows      []SweepRow `json:"rows"`
	Best      Report     `json:"best"`
}

// Sweep replays w under the kv policy at every grid point, starting from
// base's other weights, and ranks the points by objective (lower is better).
func Sweep(ctx context.Context, cfg Config, base scoring.Config, g Grid, objectiveName string, w Workload) (SweepResult, error) {
	if objectiveName == "" {
		objectiveName = "ttft_p99"
	}
	if _, err := objective(objectiveName, Report{}); err != nil {
		return SweepResult{}, err
	}
	var cfgs []scoring.Config
	for _, c := range g.OverlapCredit {
		for _, d := range g.CreditDecay {
			for _, s := range g.PrefillLoadScale {
				for _, h := range g.HostWeight {
					sc := base
					sc.Policy = scoring.PolicyKV
					sc.OverlapCredit, sc.CreditDecay, sc.PrefillLoadScale, sc.HostWeight = c, d, s, h
					if err := sc.Validate(); err != nil {
						return SweepResult{}, err
					}
					cfgs = append(cfgs, sc)
				}
			}
		}
	}
	if len(cfgs) == 0 {
		return SweepResult{}, fmt.Errorf("sim: empty sweep grid")
	}
	reports, err := runAll(ctx, cfg, cfgs, w)
	if err != nil {
		return SweepResult{}, err
	}
	res := SweepResult{Objective: objectiveName, Grid: g}
	order := make([]int, len(reports))
	for i, r := range reports {
		v, _ := objective(objectiveName, r)
		sc := cfgs[i]
		res.Rows = append(res.Rows, SweepRow{
			OverlapCredit: sc.OverlapCredit, CreditDecay: sc.CreditDecay, PrefillLoadScale: sc.PrefillLoadScale,
			HostWeight: sc.HostWeight, Objective: v, HitRate: r.HitRate, TTFTP99: r.TTFT.P99, LoadCV: r.LoadCV,
			LoadCVBinned: r.LoadCVBinned, DecodeBlockCVBinned: r.DecodeBlockCVBinned,
		})
		order[i] = i
	}
	slices.SortStableFunc(order, func(a, b int) int {
		ra, rb := res.Rows[a], res.Rows[b]
		switch {
		case ra.Objective < rb.Objective:
			return -1
		case ra.Objective > rb.Objective:
			return 1
		case ra.HitRate > rb.HitRate:
			return -1
		case ra.HitRate < rb.HitRate:
			return 1
		}
		return 0
	})
	rows := make([]SweepRow, len(order))
	for i, j := range order {
		rows[i] = res.Rows[j]
	}
	res.Rows = rows
	res.Best = reports[order[0]]
	return res, nil
}

// WriteSweep prints the best setting and the top rows of the ranking.
func WriteSweep(w io.Writer, s SweepResult, top int) error {
	b := s.Rows[0]
	fmt.Fprintf(w, "best by %s: overlap_credit=%g,credit_decay=%g,prefill_load_scale=%g,host_weight=%g\n",
		s.Objective, b.OverlapCredit, b.CreditDecay, b.PrefillLoadScale, b.HostWeight)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "rank\tcredit\tdecay\tprefill scale\thost\t"+s.Objective+"\thit%\tTTFT p99 ms\tKV CV 0.5s\treq CV 0.5s\treq CV run\t")
	for i, r := range s.Rows {
		if top > 0 && i >= top {
			break
		}
		fmt.Fprintf(tw, "%d\t%g\t%g\t%g\t%g\t%.1f\t%.1f\t%.0f\t%.3f\t%.3f\t%.3f\t\n", i+1, r.OverlapCredit, r.CreditDecay,
			r.PrefillLoadScale, r.HostWeight, r.Objective, 100*r.HitRate, r.TTFTP99, r.DecodeBlockCVBinned, r.LoadCVBinned, r.LoadCV)
	}
	return tw.Flush()
}
