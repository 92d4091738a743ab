package tests_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io/fs"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenizer"
	"github.com/kvroute/kvroute/tokenizer/qwen3"
	"github.com/kvroute/kvroute/tokenizer/template"
	"github.com/kvroute/kvroute/vllmtest"
)

// frontDoor is a kvroute deployment over real Redis whose replicas are
// simulated vLLMs serving Qwen3 (its real tokenizer and chat template),
// followed by an ingestor: the front door end to end.
type frontDoor struct {
	*harness
}

func newFrontDoor(t *testing.T, tok app.Tokenizers, replicas int) *frontDoor {
	t.Helper()
	qtok, err := qwen3.Load()
	if err != nil {
		t.Fatal(err)
	}
	qtmpl, err := template.LoadFS(qwen3.FS, ".", template.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	h := &harness{t: t, ctx: ctx, url: redistest.Server(t), reps: map[string]*vllmtest.Replica{}}
	cfg := router.DefaultConfig()
	cfg.Seed = seed
	cfg.RegistryTTL = 50 * time.Millisecond
	a, err := app.New(ctx, app.Config{Listen: "127.0.0.1:0", RedisURL: h.url, Router: cfg, Tokenizers: tok})
	if err != nil {
		t.Fatalf("app: %v", err)
	}
	if err := a.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = a.Stop() })
	h.app, h.base = a, "http://"+a.Addr()
	h.st = h.openStore()
	for i := range replicas {
		h.addReplica(fmt.Sprintf("q%d", i), vllmtest.Config{Tokenizer: tokenizer.NewCache(qtok, 8<<20), ChatTemplate: qtmpl})
	}
	ing, _ := h.startIngestor("fd", h.st)
	h.waitOwned(ing)
	return &frontDoor{h}
}

// chat sends a chat completion and returns the decision's headers.
func (f *frontDoor) chat(t *testing.T, messages string) http.Header {
	t.Helper()
	body := `{"model":"` + model + `","messages":` + messages + `,"max_tokens":4}`
	req, _ := http.NewRequestWithContext(f.ctx, http.MethodPost, f.base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out json.RawMessage
	_ = json.NewDecoder(resp.Body).Decode(&out)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("chat: %d %s", resp.StatusCode, out)
	}
	return resp.Header
}

const longChat = `[{"role":"system","content":"You are a meticulous assistant for a fleet of inference servers. Answer in full sentences, explain your reasoning, and mention the block size when it matters to the answer."},{"role":"user","content":"Why does a router keep an index of cached blocks?"}]`

// TestRemoteTokenization: a model kvroute has no tokenizer files for is
// tokenized by its own replicas (vLLM's render endpoint or /tokenize),
// and a chat's second send lands where the first one's blocks are.
func TestRemoteTokenization(t *testing.T) {
	f := newFrontDoor(t, app.Tokenizers{}, 2)
	first := f.chat(t, longChat)
	if got := first.Get(api.HeaderTokenization); got != "remote" {
		t.Fatalf("tokenization %q, want remote", got)
	}
	f.synced(first.Get(api.HeaderReplica))
	again := f.chat(t, longChat)
	if again.Get(api.HeaderReplica) != first.Get(api.HeaderReplica) || again.Get(api.HeaderMatchedBlocks) == "0" {
		t.Errorf("second send on %s with %s blocks matched, want %s with some", again.Get(api.HeaderReplica), again.Get(api.HeaderMatchedBlocks), first.Get(api.HeaderReplica))
	}
}

// TestLocalEqualsRemote: kvroute's own Qwen3 tokenizer and template key a
// chat exactly as the replica does, so the shadow comparison finds no
// mismatch and the blocks kvroute believes the replica holds are the ones
// it serves.
func TestLocalEqualsRemote(t *testing.T) {
	f := newFrontDoor(t, app.Tokenizers{FS: map[string]fs.FS{model: qwen3.FS}, ShadowRate: 1}, 2)
	first := f.chat(t, longChat)
	if got := first.Get(api.HeaderTokenization); got != "local" {
		t.Fatalf("tokenization %q, want local", got)
	}
	f.synced(first.Get(api.HeaderReplica))
	again := f.chat(t, longChat)
	if again.Get(api.HeaderReplica) != first.Get(api.HeaderReplica) || again.Get(api.HeaderMatchedBlocks) == "0" {
		t.Errorf("second send on %s with %s blocks matched, want %s with some", again.Get(api.HeaderReplica), again.Get(api.HeaderMatchedBlocks), first.Get(api.HeaderReplica))
	}
	f.waitFor("shadow comparisons", func() bool {
		_, m := f.call(http.MethodGet, "/metrics", "")
		return strings.Contains(m, `kvroute_tokenizer_shadow_total{model="m",result="match"} 2`)
	})
	_, m := f.call(http.MethodGet, "/metrics", "")
	if strings.Contains(m, `result="mismatch"`) {
		t.Errorf("shadow mismatches recorded:\n%s", grepLines(m, "kvroute_tokenizer_shadow_total"))
	}
	if b, s := sumSeries(m, "kvroute_cached_tokens_believed_total"), sumSeries(m, "kvroute_cached_tokens_served_total"); b != s || s == 0 {
		t.Errorf("believed %v cached tokens, served %v; want equal and > 0", b, s)
	}
}

func grepLines(text, substr string) string {
	var out []string
	for _, l := range strings.Split(text, "\n") {
		if strings.Contains(l, substr) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
