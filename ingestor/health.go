package ingestor

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/kvroute/kvroute"
)

// probeHealth probes every owned server in parallel and records the
// result. An unhealthy replica is excluded from routing at once (by
// SetHealth); its index entries are purged only after PurgeGrace of
// continuous unhealth. The engines of a data-parallel server share its
// one /health, probed once.
func (in *Ingestor) probeHealth(ctx context.Context) {
	var wg sync.WaitGroup
	for _, g := range in.ownedServers() {
		wg.Add(1)
		go func() { defer wg.Done(); in.probeServer(ctx, g) }()
	}
	wg.Wait()
}

// ownedServers is ownedList grouped by the registered replica each is (or
// is an engine of).
func (in *Ingestor) ownedServers() [][]ownedRep {
	at := map[string]int{}
	var gs [][]ownedRep
	for _, o := range in.ownedList() {
		id := kvroute.ServerID(o.rep.ID)
		i, ok := at[id]
		if !ok {
			i = len(gs)
			at[id] = i
			gs = append(gs, nil)
		}
		gs[i] = append(gs[i], o)
	}
	return gs
}

func (in *Ingestor) probeServer(ctx context.Context, g []ownedRep) {
	id := kvroute.ServerID(g[0].rep.ID)
	h := kvroute.HealthHealthy
	if err := in.get(ctx, g[0].rep.URL+"/health", in.c.HealthInterval, nil); err != nil {
		in.log.Debug("health probe", "replica", id, "err", err)
		h = kvroute.HealthUnhealthy
	}
	// An events endpoint that cannot even be dialled for a stall period
	// means the index for this replica goes stale: route elsewhere.
	for _, o := range g {
		if h == kvroute.HealthHealthy && o.w != nil && o.w.eventsDown() > in.c.StallTimeout {
			in.log.Debug("events unreachable", "replica", o.rep.ID)
			h = kvroute.HealthUnhealthy
		}
	}
	in.m.probes.WithLabelValues(string(h)).Inc()
	now := in.c.Now()
	if err := in.st.SetHealth(ctx, id, h, now); err != nil {
		in.log.Warn("set health", "replica", id, "err", err)
	}
	for _, o := range g {
		in.probed(ctx, o, h, now)
	}
}

// probed purges o's entries after PurgeGrace of continuous unhealth.
func (in *Ingestor) probed(ctx context.Context, o ownedRep, h kvroute.Health, now time.Time) {
	in.mu.Lock()
	purge := false
	if h == kvroute.HealthHealthy {
		o.badSince, o.purged = time.Time{}, false
	} else {
		if o.badSince.IsZero() {
			o.badSince = now
		}
		purge = !o.purged && now.Sub(o.badSince) >= in.c.PurgeGrace
	}
	in.mu.Unlock()
	if !purge {
		return
	}
	if err := in.st.PurgeReplica(ctx, o.rep.Model, o.rep.ID); err != nil {
		in.log.Warn("purge", "replica", o.rep.ID, "err", err)
		return
	}
	in.log.Info("purged unhealthy replica", "replica", o.rep.ID, "after", now.Sub(o.badSince))
	in.m.purges.Inc()
	in.mu.Lock()
	o.purged = true
	in.mu.Unlock()
	if o.w != nil {
		o.w.invalidate()
	}
}

// scrapeMetrics reads every owned server's /metrics once: each engine's
// load gauges into the store, so that scoring sees traffic that bypassed
// the router, its block size into the registry, so that the router keys
// requests as the replica's events are keyed, and, for a replica that
// declared no data-parallel size, the engines its series are labelled
// with.
func (in *Ingestor) scrapeMetrics(ctx context.Context) {
	var wg sync.WaitGroup
	for _, g := range in.ownedServers() {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var v VLLMMetrics
			err := in.get(ctx, g[0].rep.URL+"/metrics", in.c.MetricsInterval, func(r io.Reader) error {
				var err error
				v, err = ParseVLLMMetrics(r)
				return err
			})
			if err == nil {
				err = in.recordScrape(ctx, g, v)
			}
			if err != nil {
				in.m.scrapes.WithLabelValues("error").Inc()
				in.log.Debug("scrape", "replica", kvroute.ServerID(g[0].rep.ID), "err", err)
				return
			}
			in.m.scrapes.WithLabelValues("ok").Inc()
		}()
	}
	wg.Wait()
}

// recordScrape writes one server's metrics: per engine when g's replicas
// are engines, else the server's totals.
func (in *Ingestor) recordScrape(ctx context.Context, g []ownedRep, v VLLMMetrics) error {
	id := kvroute.ServerID(g[0].rep.ID)
	for _, o := range g {
		l := v.EngineLoad
		if rank, ok := o.rep.Rank(); ok {
			if l, ok = v.Engines[rank]; !ok {
				continue // that engine's series are missing
			}
		}
		if err := in.st.SetScraped(ctx, o.rep.Model, o.rep.ID, l.Waiting, l.Running, l.KVUsage); err != nil {
			return err
		}
	}
	if v.BlockSize > 0 && v.BlockSize != g[0].rep.BlockSize {
		// g's copy is the registry as last loaded; the store writes
		// only a change, so a stale copy costs a read, and rejects an
		// impossible size (a counted error).
		if err := in.st.SetBlockSize(ctx, id, v.BlockSize); err != nil {
			return err
		}
	}
	if _, engine := g[0].rep.Rank(); !engine && g[0].rep.DataParallelSize == 0 && len(v.Engines) > 1 {
		n := len(v.Engines)
		in.log.Info("learned data-parallel engines from metrics", "replica", id, "engines", n)
		return in.st.SetDataParallelSize(ctx, id, n)
	}
	return nil
}

// get fetches url with a timeout of at most limit and hands a 200 body to
// read (nil: discard).
func (in *Ingestor) get(ctx context.Context, url string, limit time.Duration, read func(io.Reader) error) error {
	ctx, cancel := context.WithTimeout(ctx, min(limit, 5*time.Second))
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := noRedirects(in.c.HTTPClient).Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	if read == nil {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4096))
		return nil
	}
	return read(io.LimitReader(resp.Body, 16<<20))
}

// noRedirects is c (shared transport and timeout) refusing to follow
// redirects: a replica's /health and /metrics answer themselves, and a
// probe that followed a 3xx could be walked to any address (a metadata
// service) past the registry's address checks. A 3xx is a failed probe.
func noRedirects(c *http.Client) *http.Client {
	cc := *c
	cc.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	return &cc
}

// VLLMMetrics are the load signals kvroute reads from a replica's /metrics.
type VLLMMetrics struct {
	// EngineLoad is summed over every engine (DP rank): Waiting and
	// Running added, KVUsage the fullest engine's, 0..1.
	EngineLoad
	// Engines is each engine's own, by its engine label (a series
	// without one is engine 0): a data-parallel server's N engines, each
	// its own cache and load. Only ranks 0..MaxDataParallelSize-1 count.
	Engines map[int]EngineLoad
	// BlockSize is the cache_config_info block_size label, 0 if absent.
	BlockSize int
	// Found is false when none of the gauges was present.
	Found bool
}

// EngineLoad is one engine's load gauges.
type EngineLoad struct {
	Waiting, Running int64
	KVUsage          float64
}

// ParseVLLMMetrics reads the few series kvroute needs from Prometheus text
// exposition: vllm:num_requests_waiting, vllm:num_requests_running,
// vllm:kv_cache_usage_perc (or the older vllm:gpu_cache_usage_perc) and
// vllm:cache_config_info's block_size label. A full exposition parser would
// buy nothing here and tie us to one version of its validation rules.
func ParseVLLMMetrics(r io.Reader) (VLLMMetrics, error) {
	var v VLLMMetrics
	var kvNew, kvOld float64
	var haveNew, haveOld bool
	engNew, engOld := map[int]float64{}, map[int]float64{}
	engines := map[int]EngineLoad{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || line[0] == '#' {
			continue
		}
		name, labels, value, ok := splitSample(line)
		if !ok {
			continue
		}
		rank, err := strconv.Atoi(labelValue(labels, "engine"))
		if err != nil {
			rank = 0
		}
		inRange := rank >= 0 && rank < kvroute.MaxDataParallelSize
		e := engines[rank]
		switch name {
		case "vllm:num_requests_waiting":
			v.Waiting += int64(value)
			v.Found = true
			e.Waiting += int64(value)
		case "vllm:num_requests_running":
			v.Running += int64(value)
			v.Found = true
			e.Running += int64(value)
		case "vllm:kv_cache_usage_perc":
			kvNew, haveNew = max(kvNew, value), true
			engNew[rank] = max(engNew[rank], value)
		case "vllm:gpu_cache_usage_perc":
			kvOld, haveOld = max(kvOld, value), true
			engOld[rank] = max(engOld[rank], value)
		default:
			inRange = false
		}
		if inRange {
			engines[rank] = e
		}
		if name == "vllm:cache_config_info" {
			if bs, err := strconv.Atoi(labelValue(labels, "block_size")); err == nil && bs > 0 {
				v.BlockSize = bs
			}
		}
	}
	if err := sc.Err(); err != nil {
		return VLLMMetrics{}, fmt.Errorf("parse metrics: %w", err)
	}
	usage := engOld
	switch {
	case haveNew:
		v.KVUsage, v.Found, usage = kvNew, true, engNew
	case haveOld:
		v.KVUsage, v.Found = kvOld, true
	}
	for rank, u := range usage {
		if rank >= 0 && rank < kvroute.MaxDataParallelSize {
			e := engines[rank]
			e.KVUsage = u
			engines[rank] = e
		}
	}
	v.Engines = engines
	if !v.Found {
		return v, fmt.Errorf("parse metrics: no vllm load gauges")
	}
	return v, nil
}

// splitSample splits `name{labels} value [timestamp]`.
func splitSample(line string) (name, labels string, value float64, ok bool) {
	rest := line
	if i := strings.IndexByte(line, '{'); i >= 0 {
		j := strings.LastIndexByte(line, '}')
		if j < i {
			return "", "", 0, false
		}
		name, labels, rest = line[:i], line[i+1:j], line[j+1:]
	} else {
		i := strings.IndexAny(line, " \t")
		if i < 0 {
			return "", "", 0, false
		}
		name, rest = line[:i], line[i:]
	}
	fields := strings.Fields(rest)
	if len(fields) == 0 {
		return "", "", 0, false
	}
	f, err := strconv.ParseFloat(fields[0], 64)
	if err != nil || math.IsNaN(f) || math.IsInf(f, 0) {
		return "", "", 0, false
	}
	return strings.TrimSpace(name), labels, f, true
}

// labelValue finds key="value" in a label list (escapes are rare in the
// labels we read and only need to be skipped correctly).
func labelValue(labels, key string) string {
	for len(labels) > 0 {
		labels = strings.TrimLeft(labels, " ,")
		eq := strings.IndexByte(labels, '=')
		if eq < 0 || eq+1 >= len(labels) || labels[eq+1] != '"' {
			return ""
		}
		k := strings.TrimSpace(labels[:eq])
		var b strings.Builder
		i := eq + 2
		for ; i < len(labels) && labels[i] != '"'; i++ {
			if labels[i] == '\\' && i+1 < len(labels) {
				i++
			}
			b.WriteByte(labels[i])
		}
		if k == key {
			return b.String()
		}
		if i >= len(labels) {
			return ""
		}
		labels = labels[i+1:]
	}
	return ""
}
