package tests_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/testfiles"
	"github.com/kvroute/kvroute/internal/wait"
)

type sdkTurn struct {
	Replica      string `json:"replica"`
	Matched      int    `json:"matched"`
	Tokenization string `json:"tokenization"`
	Blind        string `json:"blind"`
	SawUsage     bool   `json:"sawUsage"`
}

// TestOpenAISDKStreamingChat is the front door's promise, run the way a
// user runs it: `kvroute serve --demo-replicas 3` as a process, and the
// official OpenAI Node SDK streaming chat through its proxy. Turn 2 of each
// of 20 conversations must land on turn 1's replica with blocks matched
// (at least 18 of 20), no decision may be cache-blind, the usage chunk
// kvroute asks for must not reach a client that did not, and what kvroute
// believed each replica held must equal what the replicas served.
func TestOpenAISDKStreamingChat(t *testing.T) {
	sdk := filepath.Join(testfiles.NodeModules(t), "openai")
	p := startServe(t, "--demo-replicas", "3")
	waitDemoFollowed(t, p)
	_, before := p.get(t, "/metrics")

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "node", filepath.Join(testfiles.Root(), "tests", "testdata", "openai_chat.cjs"))
	cmd.Env = append(os.Environ(), "KVROUTE_URL="+p.base, "OPENAI_SDK="+sdk, "CONVERSATIONS=20")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("node: %v\n%s", err, stderr.String())
	}
	sticky, conversations := 0, 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		var c struct {
			Conversation  int
			First, Second sdkTurn
		}
		if err := json.Unmarshal(sc.Bytes(), &c); err != nil {
			t.Fatalf("bad line %q: %v", sc.Text(), err)
		}
		conversations++
		for _, turn := range []sdkTurn{c.First, c.Second} {
			if turn.Tokenization != "local" || turn.Blind != "" {
				t.Errorf("conversation %d: tokenization %q, cache-blind %q; want local and never blind", c.Conversation, turn.Tokenization, turn.Blind)
			}
			if turn.SawUsage {
				t.Errorf("conversation %d: the client saw a usage chunk it never asked for", c.Conversation)
			}
		}
		if c.Second.Replica == c.First.Replica && c.Second.Matched > 0 {
			sticky++
		} else {
			t.Logf("conversation %d: turn 1 on %s, turn 2 on %s with %d blocks matched", c.Conversation, c.First.Replica, c.Second.Replica, c.Second.Matched)
		}
	}
	if conversations != 20 {
		t.Fatalf("got %d conversations, want 20", conversations)
	}
	if sticky < 18 {
		t.Errorf("turn 2 landed on turn 1's replica with blocks matched in %d of 20 conversations, want at least 18", sticky)
	}
	t.Logf("turn 2 on turn 1's replica with blocks matched: %d of 20", sticky)

	_, after := p.get(t, "/metrics")
	delta := func(name string) float64 { return sumSeries(after, name) - sumSeries(before, name) }
	believed, served := delta("kvroute_cached_tokens_believed_total"), delta("kvroute_cached_tokens_served_total")
	compared, phantom := delta("kvroute_cache_compared_total"), delta("kvroute_cache_phantom_total")
	t.Logf("believed %v cached tokens, served %v, over %v compared responses (%v phantom)", believed, served, compared, phantom)
	if compared != 40 || believed != served || phantom != 0 || served == 0 {
		t.Errorf("believed %v, served %v, compared %v, phantom %v: want 40 compared, believed equal to served (> 0), no phantom", believed, served, compared, phantom)
	}
	if blind := sumSeries(after, "kvroute_decisions_cache_blind_total"); blind != 0 {
		t.Errorf("%v cache-blind decisions, want none", blind)
	}
}

// waitDemoFollowed waits until the embedded ingestor follows the demo
// replicas' event streams: a warm-up chat's blocks show up in the index.
func waitDemoFollowed(t *testing.T, p *process) {
	t.Helper()
	wait.UntilNil(t, "the demo replicas registered", func() error {
		if _, body := p.get(t, "/v1/models"); !strings.Contains(body, `"id":"demo"`) || !strings.Contains(body, `"routable":3`) {
			return fmt.Errorf("/v1/models: %s", body)
		}
		return nil
	})
	// A chat sent before the ingestor subscribed is lost to the index:
	// each poll sends one more, until one's blocks show up.
	warm := `{"model":"demo","messages":[{"role":"user","content":"warm up: a prompt long enough to fill a couple of sixteen-token blocks of the cache, so that the index shows them"}],"max_tokens":1}`
	wait.UntilNil(t, "the demo replicas' events in the index", func() error {
		if status, _, body := p.post(t, "/v1/chat/completions", warm); status != 200 {
			t.Fatalf("warm-up chat: %d %s", status, body)
		}
		for _, id := range []string{"demo-0", "demo-1", "demo-2"} {
			_, detail := p.get(t, "/v1/replicas/"+id)
			var d struct {
				Blocks int `json:"blocks"`
			}
			if json.Unmarshal([]byte(detail), &d) == nil && d.Blocks > 0 {
				return nil
			}
		}
		_, body := p.get(t, "/v1/replicas")
		return fmt.Errorf("/v1/replicas: %s", body)
	})
	// Every replica followed as the decisions see it (their registry copy
	// is cached): three round-robin decisions in a row, one on each
	// replica, none index-incomplete. Each booking is released.
	route := `{"model":"demo","token_ids":[1,2,3],"max_tokens":1,"policy":"round-robin"}`
	wait.UntilNil(t, "every demo replica followed in the decisions' view", func() error {
		for range 3 {
			status, _, body := p.post(t, "/v1/route", route)
			var d struct {
				RequestID  string `json:"request_id"`
				Incomplete bool   `json:"index_incomplete"`
			}
			if status != 200 || json.Unmarshal([]byte(body), &d) != nil {
				t.Fatalf("route: %d %s", status, body)
			}
			p.post(t, "/v1/requests/"+d.RequestID+"/release", "")
			if d.Incomplete {
				return fmt.Errorf("a decision was index-incomplete: %s", body)
			}
		}
		return nil
	})
}

// sumSeries adds every sample of a metric in Prometheus text format.
func sumSeries(text, name string) float64 {
	re := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(name) + `(\{[^}]*\})? (\S+)$`)
	var sum float64
	for _, m := range re.FindAllStringSubmatch(text, -1) {
		v, err := strconv.ParseFloat(m[2], 64)
		if err == nil {
			sum += v
		}
	}
	return sum
}
