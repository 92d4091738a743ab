package tests_test

import (
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/vllmtest"
)

// dpRanks is the data-parallel size of the tests' simulated server.
const dpRanks = 4

// addDataParallel starts a simulated `vllm serve --data-parallel-size 4`
// and registers it as id, declaring its ranks when declare is set.
func (h *harness) addDataParallel(id string, ignoreRank, declare bool) *vllmtest.DataParallel {
	h.t.Helper()
	dp, err := vllmtest.NewDataParallel(vllmtest.Config{Model: h.model(), BlockSize: bs}, dpRanks, ignoreRank)
	if err != nil {
		h.t.Fatal(err)
	}
	if err := dp.Start(h.ctx); err != nil {
		h.t.Fatal(err)
	}
	h.t.Cleanup(func() { _ = dp.Stop() })
	size := 0
	if declare {
		size = dpRanks
	}
	body := fmt.Sprintf(`{"model":%q,"url":%q,"events":%q,"replay":%q,"data_parallel_size":%d}`,
		h.model(), dp.URL(), dp.EventsEndpoint(), dp.ReplayEndpoint(), size)
	if code, resp := h.call("PUT", "/v1/replicas/"+id, body); code != http.StatusOK && code != http.StatusCreated {
		h.t.Fatalf("register %s: %d %s", id, code, resp)
	}
	return dp
}

// followEngines waits until every engine of id's is followed and its
// publisher sees the subscriber.
func (h *harness) followEngines(id string, dp *vllmtest.DataParallel, owned func() []string) {
	h.t.Helper()
	h.waitFor("every engine followed", func() bool {
		n := 0
		for _, o := range owned() {
			if kvroute.ServerID(o) == id && o != id {
				n++
			}
		}
		return n == dp.Size()
	})
	for rank := range dp.Size() {
		if err := dp.Engine(rank).WaitSubscribed(h.ctx); err != nil {
			h.t.Fatalf("engine %d: %v", rank, err)
		}
	}
}

// enginesSynced waits until the store has applied every batch each engine
// published.
func (h *harness) enginesSynced(id string, dp *vllmtest.DataParallel) {
	h.t.Helper()
	for rank := range dp.Size() {
		e, eid := dp.Engine(rank), kvroute.EngineID(id, rank)
		h.waitFor(eid+" applied up to its last batch", func() bool {
			if e.Seq() == 0 {
				return true
			}
			seq, ok, err := h.st.AppliedSeq(h.ctx, h.model(), eid)
			return err == nil && ok && seq == e.Seq()-1
		})
	}
}

// dpDecision is a decision's answer with its rank.
type dpDecision struct {
	decision
	Rank       *int `json:"data_parallel_rank"`
	Candidates []struct {
		ID string `json:"id"`
	} `json:"candidates"`
}

func (h *harness) routeDP(tokens []int) dpDecision {
	h.t.Helper()
	b, _ := json.Marshal(map[string]any{"model": h.model(), "token_ids": tokens, "explain": true})
	code, body := h.call("POST", "/v1/route", string(b))
	if code != http.StatusOK {
		h.t.Fatalf("route: %d %s", code, body)
	}
	var d dpDecision
	if err := json.Unmarshal([]byte(body), &d); err != nil {
		h.t.Fatalf("route: %v in %s", err, body)
	}
	h.call("POST", "/v1/requests/"+d.RequestID+"/release", "")
	return d
}

// complete proxies a completion of tokens and returns the cached tokens
// the replica reported and the rank header kvroute answered with.
func (h *harness) complete(tokens []int) (cached int, replica, rank string) {
	h.t.Helper()
	body, _ := json.Marshal(map[string]any{"model": h.model(), "prompt": tokens, "max_tokens": 1})
	req, _ := http.NewRequestWithContext(h.ctx, "POST", h.base+"/v1/completions", bytesReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
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
		h.t.Fatalf("decode completion (status %d): %v", resp.StatusCode, err)
	}
	return out.Usage.Details.Cached, resp.Header.Get("X-Kvroute-Replica"), resp.Header.Get("X-data-parallel-rank")
}

// TestDataParallelPinned: a 4-rank server whose ranks the ingestor learns
// from its metrics; a prompt cached on rank 2 is routed to rank 2, and
// the proxied request, pinned there by X-data-parallel-rank, is served
// from rank 2's cache.
func TestDataParallelPinned(t *testing.T) {
	h := newHarness(t)
	dp := h.addDataParallel("dp", false, false)
	ing, _ := h.startIngestor("ing", h.openStore())
	h.waitFor("ranks learned from the engine labels", func() bool {
		r, err := h.st.GetReplica(h.ctx, "dp")
		return err == nil && r.DataParallelSize == dpRanks
	})
	h.followEngines("dp", dp, ing.Owned)

	r := rand.New(rand.NewPCG(21, 2))
	p := prompt(r, nil, 10*bs+5)
	if _, err := dp.Engine(2).Admit(p, ""); err != nil {
		t.Fatal(err)
	}
	h.enginesSynced("dp", dp)

	t.Run("decision names rank 2", func(t *testing.T) {
		d := h.routeDP(prompt(r, p, 3*bs))
		if d.Replica.ID != "dp" || d.Rank == nil || *d.Rank != 2 || d.Matched != 10 {
			t.Errorf("got replica %q rank %v matched %d, want dp rank 2 matched 10", d.Replica.ID, d.Rank, d.Matched)
		}
		if len(d.Candidates) != dpRanks {
			t.Errorf("got %d candidates, want one per engine (%d)", len(d.Candidates), dpRanks)
		}
	})
	t.Run("proxied to rank 2, served from its cache", func(t *testing.T) {
		cached, replica, rank := h.complete(prompt(r, p, 2*bs))
		if replica != "dp" || rank != "2" || cached != 10*bs {
			t.Errorf("got replica %q rank %q cached %d tokens, want dp rank 2 with %d", replica, rank, cached, 10*bs)
		}
	})
	t.Run("an honoured pin is never flagged", func(t *testing.T) {
		for i := range 12 {
			q := prompt(r, nil, 10*bs+5)
			h.complete(q)
			h.enginesSynced("dp", dp)
			if cached, _, rank := h.complete(q); rank == "" || cached != 10*bs {
				t.Fatalf("pair %d: rank %q cached %d, want pinned with %d cached", i, rank, cached, 10*bs)
			}
		}
		if rep, err := h.st.GetReplica(h.ctx, "dp"); err != nil || rep.PinIgnored {
			t.Errorf("got pin ignored %v (%v), want false for a server that honours the header", rep.PinIgnored, err)
		}
	})
	t.Run("replicas list shows the ranks", func(t *testing.T) {
		code, body := h.call("GET", "/v1/replicas/dp", "")
		var got struct {
			Size  int `json:"data_parallel_size"`
			Ranks []struct {
				ID     string `json:"id"`
				Blocks int    `json:"blocks"`
			} `json:"ranks"`
		}
		if err := json.Unmarshal([]byte(body), &got); code != http.StatusOK || err != nil || got.Size != dpRanks || len(got.Ranks) != dpRanks {
			t.Fatalf("GET /v1/replicas/dp: %d %s, want data_parallel_size %d and as many ranks", code, body, dpRanks)
		}
		if got.Ranks[2].ID != "dp/2" || got.Ranks[2].Blocks == 0 {
			t.Errorf("rank 2: %+v, want dp/2 holding blocks", got.Ranks[2])
		}
	})
}

// TestDataParallelPinIgnored: the same server ignoring the header (it
// round-robins): within 20 proxied requests kvroute sees that pinned
// requests are not served the pinned engine's cache, stops pinning it
// fleet-wide, and routes it as one replica with its engines' caches
// merged.
func TestDataParallelPinIgnored(t *testing.T) {
	h := newHarness(t)
	dp := h.addDataParallel("dp", true, true)
	ing, _ := h.startIngestor("ing", h.openStore())
	h.followEngines("dp", dp, ing.Owned)

	r := rand.New(rand.NewPCG(21, 3))
	ignored := func() bool {
		rep, err := h.st.GetReplica(h.ctx, "dp")
		return err == nil && rep.PinIgnored
	}
	requests := 0
	var p []int
	for requests < 20 && !ignored() {
		p = prompt(r, nil, 10*bs+5)
		h.complete(p) // cached by whichever engine the server picked
		h.enginesSynced("dp", dp)
		h.complete(p) // pinned there (until detected), served elsewhere
		requests += 2
	}
	// The registry write is off the response's path: it lands soon after
	// the response that tripped the check, which was one of these.
	h.waitFor("the ignored pin recorded in the registry", ignored)
	t.Logf("detected after %d proxied requests", requests)

	h.waitFor("routed as one replica", func() bool {
		d := h.routeDP(p)
		return d.Rank == nil && len(d.Candidates) == 1
	})
	d := h.routeDP(p)
	if d.Replica.ID != "dp" || d.Rank != nil || d.Matched != 10 {
		t.Errorf("got replica %q rank %v matched %d, want dp, no rank, 10 matched (its engines merged)", d.Replica.ID, d.Rank, d.Matched)
	}
	if _, _, rank := h.complete(p); rank != "" {
		t.Errorf("proxied with rank %q after the pin was dropped, want none", rank)
	}
	if _, body := h.call("GET", "/metrics", ""); !strings.Contains(body, `kvroute_data_parallel_pin_ignored_total{replica="dp"} 1`) {
		t.Errorf("/metrics does not count the replica found ignoring its pins")
	}
}

// freeRun finds n consecutive free loopback ports, for a process that
// binds a port per data-parallel rank.
func freeRun(t *testing.T, n int) int {
	t.Helper()
	for range 50 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		base := l.Addr().(*net.TCPAddr).Port
		ls := []net.Listener{l}
		ok := true
		for i := 1; i < n && ok; i++ {
			li, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
			if ok = err == nil; ok {
				ls = append(ls, li)
			}
		}
		for _, li := range ls {
			_ = li.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatalf("no %d consecutive free ports", n)
	return 0
}

// TestDataParallelProcess: `kvroute sim-replica --data-parallel-size 4`
// as a process, registered without its size: the ranks are learned, a
// prompt sent to rank 2 by its header is routed and proxied to rank 2.
func TestDataParallelProcess(t *testing.T) {
	h := newHarness(t)
	ports := freeRun(t, 2*dpRanks+1)
	httpAddr := "127.0.0.1:" + strconv.Itoa(ports+2*dpRanks)
	events, replay := "tcp://127.0.0.1:"+strconv.Itoa(ports), "tcp://127.0.0.1:"+strconv.Itoa(ports+dpRanks)
	cmd := exec.Command(kvrouteBinary(t), "sim-replica", "--model", h.model(), "--data-parallel-size", strconv.Itoa(dpRanks),
		"--listen", httpAddr, "--events", events, "--replay", replay, "--prefill-tokens-per-sec", "0", "--decode-tokens-per-sec", "0")
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	url := "http://" + httpAddr
	h.waitFor("sim-replica serves", func() bool {
		resp, err := http.Get(url + "/health")
		if err == nil {
			resp.Body.Close()
		}
		return err == nil && resp.StatusCode == http.StatusOK
	})
	body := fmt.Sprintf(`{"model":%q,"url":%q,"events":%q,"replay":%q}`, h.model(), url, events, replay)
	if code, resp := h.call("PUT", "/v1/replicas/dp", body); code != http.StatusOK && code != http.StatusCreated {
		t.Fatalf("register: %d %s", code, resp)
	}
	h.startIngestor("ing", h.openStore())
	h.waitFor("ranks learned and followed", func() bool {
		r, err := h.st.GetReplica(h.ctx, "dp")
		return err == nil && r.DataParallelSize == dpRanks && !r.FollowedSince.IsZero()
	})

	r := rand.New(rand.NewPCG(21, 4))
	p := prompt(r, nil, 10*bs+5)
	b, _ := json.Marshal(map[string]any{"model": h.model(), "prompt": p, "max_tokens": 1})
	req, _ := http.NewRequestWithContext(h.ctx, "POST", url+"/v1/completions", bytesReader(b))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-data-parallel-rank", "2")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()

	ext := prompt(r, p, 2*bs)
	h.waitFor("rank 2's events indexed", func() bool {
		d := h.routeDP(ext)
		return d.Matched == 10 && d.Rank != nil && *d.Rank == 2
	})
	if cached, replica, rank := h.complete(ext); replica != "dp" || rank != "2" || cached != 10*bs {
		t.Errorf("got replica %q rank %q cached %d, want dp rank 2 with %d", replica, rank, cached, 10*bs)
	}
}
