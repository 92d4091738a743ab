package ingestor_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/internal/telemetry"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/store"
	"github.com/kvroute/kvroute/vllmtest"
	"github.com/prometheus/client_golang/prometheus"
)

var _ ingestor.Store = (*store.Store)(nil)

func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	wait.Until(t, what, cond)
}

func ints(from, n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = from + i
	}
	return out
}

func u32s(xs []int) []uint32 {
	out := make([]uint32, len(xs))
	for i, x := range xs {
		out[i] = uint32(x)
	}
	return out
}

func startIngestor(t *testing.T, st ingestor.Store, bind string) (*ingestor.Ingestor, *prometheus.Registry, func()) {
	t.Helper()
	return runIngestor(t, ingestor.Config{
		Store: st, Owner: "ing-1", LeaseTTL: 600 * time.Millisecond, RegistryInterval: 20 * time.Millisecond,
		HealthInterval: 50 * time.Millisecond, MetricsInterval: 50 * time.Millisecond, SweepInterval: 50 * time.Millisecond,
		PurgeGrace: 200 * time.Millisecond, StallTimeout: 2 * time.Second, ReplayTimeout: time.Second,
		MinBackoff: 10 * time.Millisecond, MaxBackoff: 100 * time.Millisecond, Bind: bind,
		Rand: rand.New(rand.NewPCG(1, 2)),
	})
}

// runIngestor runs an ingestor configured by c, its metrics in a registry
// of their own, until the returned stop (or the test's end).
func runIngestor(t *testing.T, c ingestor.Config) (*ingestor.Ingestor, *prometheus.Registry, func()) {
	t.Helper()
	reg := prometheus.NewRegistry()
	mp, err := telemetry.NewMeterProvider(reg)
	if err != nil {
		t.Fatal(err)
	}
	c.MeterProvider = mp
	in, err := ingestor.New(c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- in.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { stopOnce(t, cancel, done) }) }
	t.Cleanup(stop)
	return in, reg, stop
}

func stopOnce(t *testing.T, cancel context.CancelFunc, done chan error) {
	t.Helper()
	{
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("Run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Run did not return")
		}
	}
}

// TestIngestorWithSimReplica runs the whole ingestor against the simulated
// vLLM replica over loopback ZeroMQ and HTTP, in every wire layout.
func TestIngestorWithSimReplica(t *testing.T) {
	for _, tc := range []struct {
		enc      string
		noTopic  bool
		topic    string
		wantName string
	}{
		{enc: vllmtest.EncodingArray, topic: "kv"},
		{enc: vllmtest.EncodingMap, noTopic: true},
	} {
		t.Run(fmt.Sprintf("%s/replay-without-topic=%v", tc.enc, tc.noTopic), func(t *testing.T) {
			rep, err := vllmtest.New(vllmtest.Config{Model: "m", EventEncoding: tc.enc, ReplayWithoutTopic: tc.noTopic, Topic: tc.topic})
			if err != nil {
				t.Fatal(err)
			}
			if err := rep.Start(t.Context()); err != nil {
				t.Fatal(err)
			}
			defer rep.Stop()
			st := newFakeStore()
			st.setReplicas(kvroute.Replica{ID: "r1", Model: "m", URL: rep.URL(), Events: rep.EventsEndpoint(), Replay: rep.ReplayEndpoint(), Topic: tc.topic})
			_, reg, stop := startIngestor(t, st, "")
			defer stop()
			ctx := t.Context()
			if err := rep.WaitSubscribed(ctx); err != nil {
				t.Fatal(err)
			}
			bs := rep.BlockSize()
			held := func(prompts ...[]int) func() bool {
				return func() bool {
					want := map[kvroute.BlockKey]bool{}
					for _, p := range prompts {
						for _, k := range kvroute.BlockKeys(kvroute.KeySpace{Model: "m"}, bs, u32s(p), nil) {
							want[k] = true
						}
					}
					got := st.heldKeys("m", "r1")
					if len(got) != len(want) {
						return false
					}
					for _, k := range got {
						if !want[k] {
							return false
						}
					}
					return true
				}
			}

			a := ints(0, 4*bs)
			if _, err := rep.Admit(a, ""); err != nil {
				t.Fatal(err)
			}
			eventually(t, "first prompt indexed", held(a))

			// Extend a: the event chains from a's last block.
			a2 := ints(0, 6*bs)
			if _, err := rep.Admit(a2, ""); err != nil {
				t.Fatal(err)
			}
			eventually(t, "extension indexed", held(a2))

			// A lost batch is replayed.
			rep.DropNext(1)
			b := ints(1000, 2*bs)
			c := ints(2000, 2*bs)
			rep.Admit(b, "")
			rep.Admit(c, "")
			eventually(t, "gap replayed", held(a2, b, c))

			// A cache salt folds into block 0 exactly as the API folds it.
			d := ints(3000, 2*bs)
			rep.Admit(d, "tenant-7")
			want := kvroute.BlockKeys(kvroute.KeySpace{Model: "m"}, bs, u32s(d), kvroute.RequestExtras("tenant-7"))
			eventually(t, "salted prompt indexed", func() bool {
				got := map[kvroute.BlockKey]bool{}
				for _, k := range st.heldKeys("m", "r1") {
					got[k] = true
				}
				return got[want[0]] && got[want[1]]
			})

			// A restart voids everything; the new process's blocks remain.
			rep.Restart()
			e := ints(4000, 3*bs)
			rep.Admit(e, "")
			eventually(t, "rebuilt after restart", held(e))

			// Health and load reach the store.
			eventually(t, "scraped load", func() bool {
				st.mu.Lock()
				defer st.mu.Unlock()
				_, ok := st.scraped["r1"]
				return ok && st.health["r1"] == kvroute.HealthHealthy
			})
			rep.SetHealthy(false)
			eventually(t, "unhealthy, then purged after the grace period", func() bool {
				st.mu.Lock()
				defer st.mu.Unlock()
				return st.health["r1"] == kvroute.HealthUnhealthy && st.purged["r1"] > 0
			})

			mfs, err := reg.Gather()
			if err != nil {
				t.Fatal(err)
			}
			got := map[string]bool{}
			for _, mf := range mfs {
				got[mf.GetName()] = true
			}
			for _, name := range []string{"kvroute_ingest_batches_total", "kvroute_ingest_gaps_total", "kvroute_ingest_resets_total", "kvroute_ingest_apply_lag_seconds"} {
				if !got[name] {
					t.Errorf("metric %s not exported", name)
				}
			}
			stop()
			st.mu.Lock()
			defer st.mu.Unlock()
			if o, ok := st.leases["ingest:r1"]; ok {
				t.Errorf("lease still held by %q after shutdown", o)
			}
		})
	}
}

func TestIngestorRegistry(t *testing.T) {
	st := newFakeStore()
	h := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			fmt.Fprint(w, "vllm:num_requests_waiting{engine=\"0\"} 1\nvllm:num_requests_running{engine=\"0\"} 2\nvllm:gpu_cache_usage_perc{engine=\"0\"} 0.5\n"+
				"vllm:cache_config_info{block_size=\"32\",engine=\"0\"} 1.0\n")
		}
	}))
	defer h.Close()
	// Another ingestor owns r2.
	st.leases["ingest:r2"] = "someone-else"
	st.setReplicas(
		kvroute.Replica{ID: "r1", Model: "m", URL: h.URL},
		kvroute.Replica{ID: "r2", Model: "m", URL: h.URL},
	)
	in, _, stop := startIngestor(t, st, "")
	defer stop()
	eventually(t, "r1 owned", func() bool { o := in.Owned(); return len(o) == 1 && o[0] == "r1" })
	eventually(t, "r1 scraped", func() bool {
		st.mu.Lock()
		defer st.mu.Unlock()
		return st.scraped["r1"] == [3]float64{1, 2, 0.5} && st.blockSize["r1"] == 32
	})
	st.mu.Lock()
	if _, ok := st.blockSize["r2"]; ok {
		t.Error("block size written for r2, which another ingestor owns")
	}
	st.mu.Unlock()
	st.setReplicas(kvroute.Replica{ID: "r2", Model: "m", URL: h.URL})
	eventually(t, "deleted r1 dropped and purged", func() bool {
		st.mu.Lock()
		purged := st.purged["r1"]
		st.mu.Unlock()
		return len(in.Owned()) == 0 && purged == 1
	})
	// r2's owner crashes and its lease expires: we take over.
	st.mu.Lock()
	delete(st.leases, "ingest:r2")
	st.mu.Unlock()
	eventually(t, "r2 taken over", func() bool { o := in.Owned(); return len(o) == 1 && o[0] == "r2" })
}

func TestParseVLLMMetrics(t *testing.T) {
	text := `# HELP vllm:num_requests_waiting Number of requests waiting.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
vllm:num_requests_waiting{engine="1",model_name="m"} 2.0
vllm:num_requests_running{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.75
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.1
vllm:cache_config_info{block_size="32",enable_prefix_caching="True",prefix_caching_hash_algo="sha256_cbor",x="a\"b"} 1.0
`
	got, err := ingestor.ParseVLLMMetrics(strings.NewReader(text))
	if err != nil {
		t.Fatal(err)
	}
	want := ingestor.VLLMMetrics{
		EngineLoad: ingestor.EngineLoad{Waiting: 5, Running: 4, KVUsage: 0.75}, BlockSize: 32, Found: true,
		Engines: map[int]ingestor.EngineLoad{0: {Waiting: 3, Running: 4, KVUsage: 0.25}, 1: {Waiting: 2, KVUsage: 0.75}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, want %+v", got, want)
	}
	t.Run("older gauge name", func(t *testing.T) {
		got, err := ingestor.ParseVLLMMetrics(strings.NewReader("vllm:gpu_cache_usage_perc 0.4\nvllm:num_requests_running 1\n"))
		if err != nil || got.KVUsage != 0.4 || got.Running != 1 {
			t.Errorf("got %+v, %v", got, err)
		}
	})
	t.Run("not vllm", func(t *testing.T) {
		if _, err := ingestor.ParseVLLMMetrics(strings.NewReader("up 1\n")); err == nil {
			t.Error("got nil error")
		}
	})
}
