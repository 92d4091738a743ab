package sim

import (
	"math"
	"slices"
	"time"

	"github.com/kvroute/kvroute/scoring"
)

// Report is one policy's replay. Its JSON form is stable: fields are only
// ever added. Times are milliseconds (suffix _ms) or seconds (suffix _s);
// rates are fractions in 0..1.
type Report struct {
	// Policy is the scoring policy; Weights the full scoring config used.
	Policy  scoring.Policy `json:"policy"`
	Weights scoring.Config `json:"weights"`
	// Workload names the workload; Replicas is the fleet size.
	Workload string `json:"workload"`
	Replicas int    `json:"replicas"`
	// Requests is the workload size; Completed how many finished.
	Requests  int `json:"requests"`
	Completed int `json:"completed"`
	// HitRate is prompt tokens the engines served from their caches at
	// admission over all prompt tokens (token-weighted, as vLLM's
	// prefix_cache_hits / prefix_cache_queries).
	HitRate float64 `json:"hit_rate"`
	// BelievedHitRate is the same ratio from the router's index at decision
	// time; PhantomHitRate = BelievedHitRate - HitRate (stale optimism).
	BelievedHitRate float64 `json:"believed_hit_rate"`
	PhantomHitRate  float64 `json:"phantom_hit_rate"`
	// TTFT is arrival to first token; E2E arrival to last token; Queue
	// arrival to admission by the engine.
	TTFT  Dist `json:"ttft_ms"`
	E2E   Dist `json:"e2e_ms"`
	Queue Dist `json:"queue_ms"`
	// MakespanS is first arrival to last completion, in seconds.
	MakespanS float64 `json:"makespan_s"`
	// LoadCV is the coefficient of variation across replicas of each
	// replica's time-averaged outstanding requests (routed, not finished)
	// over the makespan; 0 is perfect balance.
	LoadCV float64 `json:"load_cv"`
	// LoadCVBinned is the time-averaged imbalance: in every LoadCVBin of
	// the makespan, the coefficient of variation across replicas of their
	// outstanding requests, averaged over the bins where any request is
	// outstanding. It is the seed's (and Anyscale's) 0.5 s-bin view. LoadCV
	// can read near zero for a fleet that buried each replica in turn; this
	// cannot, and at light load its Poisson floor is the same for every
	// balanced policy, so ratios between policies stay meaningful where
	// LoadCV's small numbers are mostly noise.
	LoadCVBinned float64 `json:"load_cv_binned"`
	// DecodeBlockCVBinned is the seed's recommended balance measure
	// ("track per-replica active-decode-block dispersion alongside hit
	// rate"), reconstructed as Anyscale's footnote describes it: in every
	// LoadCVBin, the CV across replicas of the KV blocks held by requests
	// in their decode phase (each request's prompt plus output blocks,
	// from first token to last), averaged over the bins where any replica
	// holds some. It weighs a long-context request by the memory and
	// decode bandwidth it takes, where LoadCVBinned counts it as one.
	// DecodeBlockCV is the same level's whole-run CV, LoadCV's analogue.
	DecodeBlockCVBinned float64 `json:"decode_block_cv_binned"`
	DecodeBlockCV       float64 `json:"decode_block_cv"`
	// BusyCV is the coefficient of variation of per-replica busy time.
	BusyCV float64 `json:"busy_cv"`
	// Stickiness is the share of requests with a session predecessor that
	// went to the replica that served that predecessor.
	Stickiness float64 `json:"stickiness"`
	// Predictions is what became of the predicted entries the decisions
	// wrote (absent when predictions are off).
	Predictions *PredictionCounts `json:"predictions,omitempty"`
	// PerReplica holds each replica's totals, in replica order.
	PerReplica []ReplicaStats `json:"per_replica"`
	// Admission is what admission did (only when it is active: see
	// Config.Admission).
	Admission *AdmissionReport `json:"admission,omitempty"`
	// Timeline is outstanding requests per replica (outer index) averaged
	// over TimelineBins equal bins of the makespan. Not in JSON.
	Timeline [][]float64 `json:"-"`
}

// Dist summarizes a latency distribution in milliseconds.
type Dist struct {
	P50  float64 `json:"p50"`
	P99  float64 `json:"p99"`
	Mean float64 `json:"mean"`
	Max  float64 `json:"max"`
}

// ReplicaStats is one replica's share of the replay.
type ReplicaStats struct {
	Requests int `json:"requests"`
	// HitRate is this replica's served-from-cache share of its prompt tokens.
	HitRate float64 `json:"hit_rate"`
	// BusyS is time with at least one running request; PrefillS time
	// spent computing prompts.
	BusyS    float64 `json:"busy_s"`
	PrefillS float64 `json:"prefill_s"`
	// MeanOutstanding is the time-averaged number of requests routed to
	// the replica and not yet finished.
	MeanOutstanding float64 `json:"mean_outstanding"`
	// MeanDecodeBlocks is the time-averaged KV blocks held by requests in
	// their decode phase (see DecodeBlockCVBinned).
	MeanDecodeBlocks float64 `json:"mean_decode_blocks"`
}

func ms(d time.Duration) float64 { return round(float64(d)/float64(time.Millisecond), 3) }

// round keeps JSON short and stable across platforms' last-bit noise.
func round(x float64, digits int) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

func dist(xs []time.Duration) Dist {
	if len(xs) == 0 {
		return Dist{}
	}
	slices.Sort(xs)
	var sum float64
	for _, x := range xs {
		sum += float64(x)
	}
	q := func(p float64) time.Duration {
		i := int(math.Ceil(p*float64(len(xs)))) - 1
		return xs[min(max(i, 0), len(xs)-1)]
	}
	return Dist{P50: ms(q(0.50)), P99: ms(q(0.99)), Mean: ms(time.Duration(sum / float64(len(xs)))), Max: ms(xs[len(xs)-1])}
}

// LoadCVBin is LoadCVBinned's bin width, Anyscale's 0.5 s. Runs longer
// than maxCVBins bins widen it to keep the cost bounded.
const (
	LoadCVBin = 500 * time.Millisecond
	maxCVBins = 1 << 17
)

func cv(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	var mean, sq float64
	for _, x := range xs {
		mean += x
	}
	mean /= float64(len(xs))
	if mean == 0 {
		return 0
	}
	for _, x := range xs {
		sq += (x - mean) * (x - mean)
	}
	return math.Sqrt(sq/float64(len(xs))) / mean
}

func (r *run) report() Report {
	n := r.cfg.Replicas
	rep := Report{
		Policy: r.sc.Policy, Weights: r.sc, Workload: r.w.Name, Replicas: n,
		Requests: len(r.w.Requests), PerReplica: make([]ReplicaStats, n),
	}
	if rep.Policy == "" {
		rep.Policy = scoring.PolicyKV
	}
	var prompt, served, believed int64
	var ttft, e2e, queue []time.Duration
	start, end := time.Duration(math.MaxInt64), time.Duration(0)
	for i := range r.reqs {
		st := &r.reqs[i]
		q := &r.w.Requests[i]
		if !st.routed {
			continue
		}
		start = min(start, st.arrive)
		prompt += int64(q.PromptTokens)
		believed += int64(st.believedTok)
		if !st.finished {
			continue
		}
		rep.Completed++
		served += int64(st.servedTok)
		end = max(end, st.done)
		ttft = append(ttft, st.first-st.arrive)
		e2e = append(e2e, st.done-st.arrive)
		queue = append(queue, st.start-st.arrive)
	}
	if r.adm != nil {
		rep.Admission = r.admissionReport()
	}
	if rep.Completed == 0 {
		return rep
	}
	rep.HitRate = round(float64(served)/float64(max(prompt, 1)), 6)
	rep.BelievedHitRate = round(float64(believed)/float64(max(prompt, 1)), 6)
	rep.PhantomHitRate = round(rep.BelievedHitRate-rep.HitRate, 6)
	rep.TTFT, rep.E2E, rep.Queue = dist(ttft), dist(e2e), dist(queue)
	span := end - start
	rep.MakespanS = round(span.Seconds(), 6)
	if c := r.view.Predictions(time.Time{}.Add(r.now)); c != (PredictionCounts{}) {
		rep.Predictions = &c
	}
	if r.sticky[1] > 0 {
		rep.Stickiness = round(float64(r.sticky[0])/float64(r.sticky[1]), 6)
	}

	mean, binned, timeline := integrate(r.trail, n, start, span, r.cfg.TimelineBins)
	rep.Timeline = timeline
	kvMean, kvBinned, _ := integrate(r.kvTrail, n, start, span, 0)
	busy := make([]float64, n)
	for p := range n {
		e := &r.eng[p]
		busy[p] = e.busySum.Seconds()
		hr := 0.0
		if e.promptTok > 0 {
			hr = float64(e.servedTk) / float64(e.promptTok)
		}
		rep.PerReplica[p] = ReplicaStats{
			Requests: e.requests, HitRate: round(hr, 6), BusyS: round(busy[p], 3),
			PrefillS: round(e.prefillSum.Seconds(), 3), MeanOutstanding: round(mean[p], 4),
			MeanDecodeBlocks: round(kvMean[p], 4),
		}
	}
	rep.LoadCV = round(cv(mean), 6)
	rep.LoadCVBinned = round(binned, 6)
	rep.DecodeBlockCV = round(cv(kvMean), 6)
	rep.DecodeBlockCVBinned = round(kvBinned, 6)
	rep.BusyCV = round(cv(busy), 6)
	return rep
}

// integrate turns a trail of per-replica levels into each replica's
// time-averaged level over [start, start+span) and the mean, over the
// LoadCVBin bins where any replica's level is non-zero, of the
// across-replica CV within the bin. With bins > 0 it also returns the
// level averaged over that many equal bins per replica, for the chart.
func integrate(trail []change, n int, start, span time.Duration, bins int) (mean []float64, binned float64, timeline [][]float64) {
	area := make([]float64, n)
	lastT := make([]time.Duration, n)
	lastC := make([]int32, n)
	for i := range lastT {
		lastT[i] = start
	}
	var tl [][]float64
	binW := 0.0
	if bins > 0 {
		tl = make([][]float64, n)
		for i := range tl {
			tl[i] = make([]float64, bins)
		}
		binW = float64(span) / float64(bins)
	}
	cvW := float64(LoadCVBin)
	cvBins := int(math.Ceil(float64(span) / cvW))
	if cvBins > maxCVBins {
		cvBins = maxCVBins
		cvW = float64(span) / float64(cvBins)
	}
	fine := make([][]float64, n)
	for i := range fine {
		fine[i] = make([]float64, max(cvBins, 1))
	}
	spread := func(dst []float64, w, a, b, c float64) {
		for k := int(a / w); k < len(dst) && float64(k)*w < b; k++ {
			lo, hi := math.Max(a, float64(k)*w), math.Min(b, float64(k+1)*w)
			if hi > lo {
				dst[k] += c * (hi - lo) / w
			}
		}
	}
	add := func(p int, from, to time.Duration, c int32) {
		if to <= from || c == 0 {
			return
		}
		area[p] += float64(c) * float64(to-from)
		spread(fine[p], cvW, float64(from-start), float64(to-start), float64(c))
		if binW > 0 {
			spread(tl[p], binW, float64(from-start), float64(to-start), float64(c))
		}
	}
	for _, ch := range trail {
		add(int(ch.rep), lastT[ch.rep], ch.at, lastC[ch.rep])
		lastT[ch.rep], lastC[ch.rep] = ch.at, ch.count
	}
	mean = make([]float64, n)
	for p := range n {
		if span > 0 {
			mean[p] = area[p] / float64(span)
		}
	}
	for p := range tl {
		for k := range tl[p] {
			tl[p][k] = round(tl[p][k], 3)
		}
	}
	col := make([]float64, n)
	var sum float64
	var used int
	for k := range cvBins {
		active := false
		for p := range n {
			col[p] = fine[p][k]
			active = active || col[p] > 0
		}
		if active {
			sum += cv(col)
			used++
		}
	}
	if used > 0 {
		binned = sum / float64(used)
	}
	return mean, binned, tl
}
