package sim

import (
	"bufio"
	"fmt"
	"html"
	"io"
	"math"
)

var palette = []string{"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

// WriteSVG draws a self-contained chart of reports: a scatter of hit rate
// (x) against TTFT p99 (y), one point per policy, and below it one small
// panel per policy of outstanding requests per replica over the makespan.
func WriteSVG(w io.Writer, reports []Report) error {
	bw := bufio.NewWriter(w)
	const (
		width  = 900
		sh     = 380 // scatter height
		pw, ph = 280, 170
		cols   = 3
	)
	rows := (len(reports) + cols - 1) / cols
	height := sh + 60 + rows*(ph+40) + 20
	p := func(format string, a ...any) { fmt.Fprintf(bw, format, a...) }
	p(`<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="sans-serif" font-size="12">`+"\n", width, height, width, height)
	p(`<rect width="100%%" height="100%%" fill="white"/>` + "\n")
	title := "kvroute sim"
	if len(reports) > 0 {
		title = fmt.Sprintf("kvroute sim: %s, %d replicas, %d requests", reports[0].Workload, reports[0].Replicas, reports[0].Requests)
	}
	p(`<text x="%d" y="22" font-size="16" text-anchor="middle">%s</text>`+"\n", width/2, html.EscapeString(title))

	// Scatter: hit rate vs TTFT p99.
	x0, y0, x1, y1 := 80.0, 50.0, float64(width-40), float64(sh-10)
	maxY := 0.0
	for _, r := range reports {
		maxY = math.Max(maxY, r.TTFT.P99)
	}
	maxY = niceCeil(maxY)
	sx := func(h float64) float64 { return x0 + h*(x1-x0) }
	sy := func(v float64) float64 { return y1 - v/maxY*(y1-y0) }
	p(`<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#888"/>`+"\n", x0, y0, x1-x0, y1-y0)
	for i := 0; i <= 10; i++ {
		h := float64(i) / 10
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/><text x="%.1f" y="%.1f" text-anchor="middle">%d%%</text>`+"\n", sx(h), y0, sx(h), y1, sx(h), y1+16, i*10)
	}
	for i := 0; i <= 5; i++ {
		v := maxY * float64(i) / 5
		p(`<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#eee"/><text x="%.1f" y="%.1f" text-anchor="end">%.0f</text>`+"\n", x0, sy(v), x1, sy(v), x0-6, sy(v)+4, v)
	}
	p(`<text x="%.0f" y="%.0f" text-anchor="middle">prefix hit rate (token-weighted)</text>`+"\n", (x0+x1)/2, y1+34)
	p(`<text x="20" y="%.0f" text-anchor="middle" transform="rotate(-90 20 %.0f)">TTFT p99 (ms)</text>`+"\n", (y0+y1)/2, (y0+y1)/2)
	for i, r := range reports {
		c := palette[i%len(palette)]
		cx, cy := sx(r.HitRate), sy(r.TTFT.P99)
		p(`<circle cx="%.1f" cy="%.1f" r="6" fill="%s"><title>%s: hit %.1f%%, TTFT p99 %.0f ms, CV in 0.5 s bins: %.3f decode KV blocks, %.3f requests</title></circle>`+"\n",
			cx, cy, c, html.EscapeString(string(r.Policy)), 100*r.HitRate, r.TTFT.P99, r.DecodeBlockCVBinned, r.LoadCVBinned)
		p(`<text x="%.1f" y="%.1f" fill="%s">%s</text>`+"\n", cx+9, cy-6+float64(i%3)*12, c, html.EscapeString(string(r.Policy)))
	}

	// Small multiples: outstanding requests per replica over time.
	top := float64(sh + 60)
	p(`<text x="%d" y="%.0f" font-size="14" text-anchor="middle">outstanding requests per replica over the makespan (one line per replica)</text>`+"\n", width/2, top-8)
	maxL := 0.0
	for _, r := range reports {
		for _, s := range r.Timeline {
			for _, v := range s {
				maxL = math.Max(maxL, v)
			}
		}
	}
	maxL = niceCeil(maxL)
	for i, r := range reports {
		ox := 30 + float64(i%cols)*(pw+10)
		oy := top + float64(i/cols)*(ph+40) + 10
		p(`<g transform="translate(%.0f,%.0f)">`+"\n", ox, oy)
		p(`<rect width="%d" height="%d" fill="none" stroke="#888"/>`+"\n", pw, ph)
		p(`<text x="%d" y="-4" text-anchor="middle">%s (request CV %.3f, makespan %.0f s)</text>`+"\n", pw/2, html.EscapeString(string(r.Policy)), r.LoadCVBinned, r.MakespanS)
		p(`<text x="-4" y="10" text-anchor="end" font-size="10">%.0f</text><text x="-4" y="%d" text-anchor="end" font-size="10">0</text>`+"\n", maxL, ph)
		for k, s := range r.Timeline {
			if len(s) == 0 {
				continue
			}
			p(`<polyline fill="none" stroke-width="1" stroke-opacity="0.7" stroke="%s" points="`, palette[k%len(palette)])
			for j, v := range s {
				x := float64(j) / float64(max(len(s)-1, 1)) * pw
				p("%.1f,%.1f ", x, ph-v/maxL*ph)
			}
			p(`"/>` + "\n")
		}
		p("</g>\n")
	}
	p("</svg>\n")
	return bw.Flush()
}

// niceCeil rounds v up to 1, 2 or 5 times a power of ten.
func niceCeil(v float64) float64 {
	if v <= 0 {
		return 1
	}
	e := math.Pow(10, math.Floor(math.Log10(v)))
	for _, m := range []float64{1, 2, 5, 10} {
		if v <= m*e {
			return m * e
		}
	}
	return 10 * e
}
