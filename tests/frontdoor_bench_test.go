package tests_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/tokenizer/qwen3"
	"github.com/kvroute/kvroute/tokenizer/template"
)

// conversation is an agent-style chat: an 8k-token system prompt and
// turns of about 1.2k tokens each, ending with a user message whose text
// varies by n, so that each decision is a new turn of the same
// conversation (the tokenization cache holds all but its last message).
func conversation(turns, n int) []map[string]string {
	msgs := []map[string]string{{"role": "system", "content": strings.Repeat("You are the routing assistant of a large inference fleet; answer with care. ", 550)}}
	for i := range turns {
		msgs = append(msgs,
			map[string]string{"role": "user", "content": fmt.Sprintf("Turn %d: ", i) + strings.Repeat("explain how block keys chain over token ids and why a hole stops the match. ", 40)},
			map[string]string{"role": "assistant", "content": strings.Repeat("Each key hashes its parent with the block's tokens, so a key is unique to its position. ", 40)})
	}
	return append(msgs, map[string]string{"role": "user", "content": fmt.Sprintf("Final question number %d: what does the router book?", n)})
}

// BenchmarkFrontDoor measures the front door's price on the decision path:
// POST /v1/route for a ~32k-token chat sent as messages (rendered with
// Qwen3's template and tokenized in process, tokenization cache warm)
// against the same decision with the same prompt's token ids given, in
// the same run, over real HTTP and a real redis-server, on 64 replicas of
// which a quarter hold the conversation's prefix. Target: messages p50 <=
// 1.5x token_ids p50.
func BenchmarkFrontDoor(b *testing.B) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cfg := router.DefaultConfig()
	a, err := app.New(ctx, app.Config{
		Listen: "127.0.0.1:0", RedisURL: redistest.Server(b), Router: cfg,
		Tokenizers: app.Tokenizers{FS: map[string]fs.FS{"m": qwen3.FS}, NoRemote: true},
	})
	if err != nil {
		b.Fatal(err)
	}
	if err := a.Start(); err != nil {
		b.Fatal(err)
	}
	defer a.Stop()
	base := "http://" + a.Addr()

	tmpl, err := template.LoadFS(qwen3.FS, ".", template.Options{})
	if err != nil {
		b.Fatal(err)
	}
	tok, err := qwen3.Load()
	if err != nil {
		b.Fatal(err)
	}
	idsOf := func(msgs []map[string]string) []uint32 {
		raw, _ := json.Marshal(msgs)
		out, err := tmpl.Render(template.Request{Messages: raw})
		if err != nil {
			b.Fatal(err)
		}
		ids, err := tok.Encode(out.Prompt, false)
		if err != nil {
			b.Fatal(err)
		}
		return ids
	}
	const turns = 17 // about 32k tokens in all
	prefix := idsOf(conversation(turns, 0))
	b.Logf("prompt: %d tokens, %d blocks", len(prefix), len(prefix)/kvroute.DefaultBlockSize)

	// 64 replicas; every fourth holds the conversation's prefix to a
	// different depth, as in an agent fleet.
	keys := kvroute.BlockKeys(a.Router.KeySpace("m", ""), kvroute.DefaultBlockSize, prefix, kvroute.RequestExtras(""))
	for i := range 64 {
		id := fmt.Sprintf("r%03d", i)
		if err := a.Store.PutReplica(ctx, kvroute.Replica{ID: id, Model: "m", URL: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:1"}); err != nil {
			b.Fatal(err)
		}
		held := keys[:4]
		if i%4 == 0 {
			held = keys[:len(keys)/2+i*len(keys)/128]
		}
		holdChain(b, ctx, a.Store, "m", id, held, 0, func(j int) uint64 { return uint64(held[j]) ^ uint64(i) })
	}
	a.Router.Invalidate()

	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	post := func(body []byte) time.Duration {
		start := time.Now()
		resp, err := client.Post(base+"/v1/route", "application/json", bytes.NewReader(body))
		if err != nil {
			b.Fatal(err)
		}
		raw, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		took := time.Since(start)
		if resp.StatusCode != http.StatusOK {
			b.Fatalf("%d %s", resp.StatusCode, raw)
		}
		return took
	}
	// Bodies are built ahead: the benchmark times the service, not the
	// client's JSON encoding.
	const variants = 64
	chats, idBodies := make([][]byte, variants), make([][]byte, variants)
	for n := range variants {
		msgs := conversation(turns, n)
		chats[n], _ = json.Marshal(map[string]any{"model": "m", "messages": msgs, "max_tokens": 64})
		idBodies[n], _ = json.Marshal(map[string]any{"model": "m", "token_ids": idsOf(msgs), "max_tokens": 64})
	}
	// Warm the tokenization cache with the conversation so far.
	post(chats[0])

	var chat, given latencies
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		n := 1 + i%(variants-1)
		chat = append(chat, post(chats[n]))
		given = append(given, post(idBodies[n]))
	}
	b.StopTimer()
	b.ReportMetric(float64(chat.p50().Microseconds()), "messages-p50-µs")
	b.ReportMetric(float64(given.p50().Microseconds()), "token_ids-p50-µs")
	b.ReportMetric(float64(chat.p50())/float64(given.p50()), "messages/token_ids")
	b.Logf("bodies: messages %d bytes, token_ids %d bytes", len(chats[1]), len(idBodies[1]))
}
