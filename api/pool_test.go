package api_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
)

// TestRecycledBuffers: /v1/route recycles a decision's body and id buffers
// once it has answered. Decisions in flight together, on prompts of many
// sizes (so that buffers move between requests of different lengths),
// must each be made on their own ids: a buffer handed on while still read
// would key a prompt wrongly and match the wrong blocks.
func TestRecycledBuffers(t *testing.T) {
	reps := []kvroute.Replica{
		{ID: "r0", Model: "m", URL: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:1"},
		{ID: "r1", Model: "m", URL: "http://127.0.0.1:2", Events: "tcp://127.0.0.1:1"},
	}
	h := newHarness(t, reps)
	type prompt struct {
		body         string
		tokens, held int
		holder       string
	}
	var prompts []prompt
	for i, n := range []int{17, 300, 4096, 40, 9000, 1500, 64, 20000} {
		ids := make([]uint32, n)
		for j := range ids {
			ids[j] = uint32(1000*i + j)
		}
		// r0 or r1 holds the first half of the prompt's blocks.
		held := n / kvroute.DefaultBlockSize / 2
		holder := reps[i%2].ID
		h.store.Hold(holder, h.keys(t, ids)[:held])
		raw, _ := json.Marshal(map[string]any{"model": "m", "token_ids": ids, "max_tokens": 1})
		prompts = append(prompts, prompt{body: string(raw), tokens: n, held: held, holder: holder})
	}
	var wg sync.WaitGroup
	errs := make(chan error, 400)
	for w := range 16 {
		wg.Go(func() {
			for i := range 25 {
				p := prompts[(w+i)%len(prompts)]
				resp, err := http.Post(h.srv.URL+"/v1/route", "application/json", strings.NewReader(p.body))
				if err != nil {
					errs <- err
					return
				}
				raw, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				var d api.RouteResponse
				if err := json.Unmarshal(raw, &d); err != nil || resp.StatusCode != http.StatusOK {
					errs <- fmt.Errorf("%d tokens: %d %s", p.tokens, resp.StatusCode, raw)
					continue
				}
				if d.PromptTokens != p.tokens || d.PromptBlocks != p.tokens/kvroute.DefaultBlockSize {
					errs <- fmt.Errorf("%d tokens: answered prompt_tokens %d, prompt_blocks %d", p.tokens, d.PromptTokens, d.PromptBlocks)
				}
				if p.held > 0 && d.Replica.ID == p.holder && d.MatchedBlocks != p.held {
					errs <- fmt.Errorf("%d tokens on holder %s: matched %d blocks, want %d", p.tokens, p.holder, d.MatchedBlocks, p.held)
				}
				if d.Replica.ID != p.holder && d.MatchedBlocks != 0 {
					errs <- fmt.Errorf("%d tokens on %s, which holds none: matched %d blocks", p.tokens, d.Replica.ID, d.MatchedBlocks)
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	n := 0
	for err := range errs {
		if n++; n <= 10 {
			t.Error(err)
		}
	}
}
