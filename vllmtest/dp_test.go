package vllmtest_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/vllmtest"
)

func TestDataParallel(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := func(t *testing.T, ignore bool) *vllmtest.DataParallel {
		t.Helper()
		dp, err := vllmtest.NewDataParallel(vllmtest.Config{Model: "m", BlockSize: 4}, 3, ignore)
		if err != nil {
			t.Fatal(err)
		}
		if err := dp.Start(ctx); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = dp.Stop() })
		return dp
	}
	complete := func(t *testing.T, dp *vllmtest.DataParallel, rank string) int {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "POST", dp.URL()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":"hello there, data parallel","max_tokens":1}`))
		if rank != "" {
			req.Header.Set(vllmtest.HeaderDataParallelRank, rank)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out struct {
			Usage struct {
				Details struct {
					Cached int `json:"cached_tokens"`
				} `json:"prompt_tokens_details"`
			} `json:"usage"`
		}
		if err := json.NewDecoder(resp.Body).Decode(&out); err != nil {
			t.Fatal(err)
		}
		return out.Usage.Details.Cached
	}
	t.Run("engines at offset ports", func(t *testing.T) {
		dp := start(t, false)
		port := func(ep string) string { return ep[strings.LastIndexByte(ep, ':')+1:] }
		for rank := 1; rank < dp.Size(); rank++ {
			got, want := port(dp.Engine(rank).EventsEndpoint()), port(dp.EventsEndpoint())
			if got == want {
				t.Errorf("rank %d events on rank 0's port %s", rank, got)
			}
		}
	})
	t.Run("the header picks the cache", func(t *testing.T) {
		dp := start(t, false)
		if got := complete(t, dp, "1"); got != 0 {
			t.Fatalf("cold rank 1 served %d cached", got)
		}
		if got := complete(t, dp, "1"); got == 0 {
			t.Errorf("rank 1 again served nothing cached")
		}
		if got := complete(t, dp, "2"); got != 0 {
			t.Errorf("rank 2 served %d cached tokens of rank 1's cache", got)
		}
		if dp.Engine(0).CachedBlocks() != 0 {
			t.Errorf("rank 0 cached blocks it never served")
		}
	})
	t.Run("ignored, it round-robins", func(t *testing.T) {
		dp := start(t, true)
		complete(t, dp, "1")
		if got := complete(t, dp, "1"); got != 0 {
			t.Errorf("the second request served %d cached: it went to the same engine", got)
		}
	})
	t.Run("metrics per engine", func(t *testing.T) {
		dp := start(t, false)
		resp, err := http.Get(dp.URL() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		text := string(b)
		for _, want := range []string{`engine="0"`, `engine="1"`, `engine="2"`} {
			if !strings.Contains(text, "vllm:num_requests_running{"+want) {
				t.Errorf("no running series for %s", want)
			}
		}
		if n := strings.Count(text, "# TYPE vllm:num_requests_running "); n != 1 {
			t.Errorf("%d TYPE lines for one family, want 1", n)
		}
	})
}
