package sim

import (
	"cmp"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// AdmissionReport is what admission did in a run: how many requests were
// admitted (at once or after queuing) and shed, and, per band and per
// tenant, the TTFT (arrival to first token, queue wait included) and the
// cost served.
type AdmissionReport struct {
	// Admitted counts the requests routed; Queued those that waited in
	// the queue (then admitted, or shed when their TTL passed); Shed the
	// requests refused, by reason (kvroute.ShedQueueFull, ShedBandFull,
	// ShedTenantFull, ShedTTL).
	Admitted int            `json:"admitted"`
	Queued   int            `json:"queued"`
	Shed     map[string]int `json:"shed,omitempty"`
	// MaxQueue is the most requests queued at once.
	MaxQueue int `json:"max_queue"`
	// Bands are per priority, ascending; Tenants per tenant, by name.
	Bands   []BandStats   `json:"bands"`
	Tenants []TenantStats `json:"tenants"`
}

// ClassStats is one band's or one tenant's share of a run.
type ClassStats struct {
	// Requests counts those that arrived; Admitted, Queued and Shed as in
	// AdmissionReport.
	Requests int `json:"requests"`
	Admitted int `json:"admitted"`
	Queued   int `json:"queued"`
	Shed     int `json:"shed"`
	// TTFT is arrival to first token of the completed requests, queue
	// wait included.
	TTFT Dist `json:"ttft_ms"`
	// ServedCost is the fairness charge of the admitted requests: the
	// prompt tokens the best replica did not hold when they arrived plus
	// their output tokens (admission.Queue's Cost).
	ServedCost int64 `json:"served_cost"`
}

// BandStats is one priority band's ClassStats.
type BandStats struct {
	Priority int `json:"priority"`
	ClassStats
}

// TenantStats is one tenant's ClassStats.
type TenantStats struct {
	Tenant string `json:"tenant"`
	ClassStats
}

// classAcc gathers one class's figures.
type classAcc struct {
	s    ClassStats
	ttft []time.Duration
}

func (c *classAcc) add(st *reqState) {
	c.s.Requests++
	switch {
	case st.routed:
		c.s.Admitted++
		c.s.ServedCost += st.cost
	case st.shed != "":
		c.s.Shed++
	}
	if st.queued {
		c.s.Queued++
	}
	if st.finished {
		c.ttft = append(c.ttft, st.first-st.arrive)
	}
}

func (c *classAcc) stats() ClassStats {
	s := c.s
	s.TTFT = dist(c.ttft)
	return s
}

func (r *run) admissionReport() *AdmissionReport {
	out := &AdmissionReport{MaxQueue: r.adm.maxLen}
	bands := map[int]*classAcc{}
	tenants := map[string]*classAcc{}
	for i := range r.reqs {
		st := &r.reqs[i]
		if !st.routed && st.shed == "" {
			continue // never sent: a shed turn's session ended
		}
		q := &r.w.Requests[i]
		if st.routed {
			out.Admitted++
		}
		if st.queued {
			out.Queued++
		}
		if st.shed != "" {
			if out.Shed == nil {
				out.Shed = map[string]int{}
			}
			out.Shed[st.shed]++
		}
		b := bands[q.Priority]
		if b == nil {
			b = &classAcc{}
			bands[q.Priority] = b
		}
		b.add(st)
		t := tenants[q.Tenant]
		if t == nil {
			t = &classAcc{}
			tenants[q.Tenant] = t
		}
		t.add(st)
	}
	for _, p := range slices.Sorted(maps.Keys(bands)) {
		out.Bands = append(out.Bands, BandStats{Priority: p, ClassStats: bands[p].stats()})
	}
	for _, n := range slices.Sorted(maps.Keys(tenants)) {
		out.Tenants = append(out.Tenants, TenantStats{Tenant: n, ClassStats: tenants[n].stats()})
	}
	return out
}

// WriteAdmission prints, for every report with admission active, its
// admitted and shed counts and one row per band and per tenant; nothing
// when none has.
func WriteAdmission(w io.Writer, reports []Report) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	header := false
	for _, r := range reports {
		a := r.Admission
		if a == nil {
			continue
		}
		if !header {
			fmt.Fprintln(tw, "policy\tclass\trequests\tadmitted\tqueued\tshed\tTTFT p50 ms\tTTFT p99 ms\tserved cost\t")
			header = true
		}
		row := func(class string, c ClassStats) {
			fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%.0f\t%.0f\t%d\t\n", r.Policy, class,
				c.Requests, c.Admitted, c.Queued, c.Shed, c.TTFT.P50, c.TTFT.P99, c.ServedCost)
		}
		for _, b := range a.Bands {
			row(fmt.Sprintf("band %d", b.Priority), b.ClassStats)
		}
		for _, t := range a.Tenants {
			row("tenant "+cmp.Or(t.Tenant, `""`), t.ClassStats)
		}
	}
	if err := tw.Flush(); err != nil || !header {
		return err
	}
	for _, r := range reports {
		if a := r.Admission; a != nil {
			fmt.Fprintf(w, "%s: admitted %d, queued %d, shed %s, most queued at once %d\n",
				r.Policy, a.Admitted, a.Queued, shedList(a.Shed), a.MaxQueue)
		}
	}
	return nil
}

func shedList(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%d %s", m[k], k))
	}
	return strings.Join(parts, ", ")
}
