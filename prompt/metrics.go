package prompt

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvroute/kvroute/tokenizer"
)

type metrics struct {
	prompts     *prometheus.CounterVec
	blind       *prometheus.CounterVec
	shadow      *prometheus.CounterVec
	remoteCache *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer, r *Resolver) (*metrics, error) {
	m := &metrics{
		prompts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_prompts_total",
			Help: "Prompts resolved to token ids, by model and source (given, local, remote, none).",
		}, []string{"model", "source"}),
		blind: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_prompts_cache_blind_total",
			Help: "Prompts that could not be tokenized, so their decisions were cache-blind, by model and reason.",
		}, []string{"model", "reason"}),
		shadow: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_tokenizer_shadow_total",
			Help: "Locally tokenized prompts also tokenized by a replica, by model and result (match, mismatch, error, skipped).",
		}, []string{"model", "result"}),
		remoteCache: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvroute_remote_tokenize_cache_total",
			Help: "Lookups of the remote-tokenization cache, by result (hit, miss).",
		}, []string{"result"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.prompts, m.blind, m.shadow, m.remoteCache, cacheCollector{r}} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// cacheCollector exports the local tokenization caches' counters, read
// when scraped.
type cacheCollector struct{ r *Resolver }

var (
	descCacheHits      = prometheus.NewDesc("kvroute_tokenizer_cache_hits_total", "Text segments answered from the tokenization cache.", []string{"model"}, nil)
	descCacheMisses    = prometheus.NewDesc("kvroute_tokenizer_cache_misses_total", "Text segments encoded and stored in the tokenization cache.", []string{"model"}, nil)
	descCacheEvictions = prometheus.NewDesc("kvroute_tokenizer_cache_evictions_total", "Entries evicted from the tokenization cache to stay within its budget.", []string{"model"}, nil)
	descCacheBytes     = prometheus.NewDesc("kvroute_tokenizer_cache_bytes", "Approximate bytes held by the tokenization cache.", []string{"model"}, nil)
)

func (c cacheCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descCacheHits
	ch <- descCacheMisses
	ch <- descCacheEvictions
	ch <- descCacheBytes
}

func (c cacheCollector) Collect(ch chan<- prometheus.Metric) {
	for name, m := range c.r.cfg.Models {
		tc, ok := m.Encoder.(*tokenizer.Cache)
		if !ok {
			continue
		}
		st := tc.Stats()
		ch <- prometheus.MustNewConstMetric(descCacheHits, prometheus.CounterValue, float64(st.Hits), name)
		ch <- prometheus.MustNewConstMetric(descCacheMisses, prometheus.CounterValue, float64(st.Misses), name)
		ch <- prometheus.MustNewConstMetric(descCacheEvictions, prometheus.CounterValue, float64(st.Evictions), name)
		ch <- prometheus.MustNewConstMetric(descCacheBytes, prometheus.GaugeValue, float64(st.Bytes), name)
	}
}
