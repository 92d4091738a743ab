package vllmtest_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/vllmtest"
)

// Test vectors from shared/VLLM_EVENTS.md §4: sha256_cbor, tokens 1..32,
// block size 16, no extra keys.
var vectors = map[string][]uint64{
	"vllm-none-hash": {8866452693264111234, 807986237951177663},
	"0":              {3236607068019569386, 2758186210834249151},
}

func seqTokens(from, n int) []int {
	ts := make([]int, n)
	for i := range ts {
		ts[i] = from + i
	}
	return ts
}

func TestEngineHashes(t *testing.T) {
	for seed, want := range vectors {
		t.Run("seed="+seed, func(t *testing.T) {
			got, err := vllmtest.EngineHashes(seed, 16, seqTokens(1, 32), "", "")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(got, want) {
				t.Errorf("EngineHashes = %v, want %v", got, want)
			}
		})
	}
	t.Run("partial block is not hashed", func(t *testing.T) {
		got, err := vllmtest.EngineHashes("0", 16, seqTokens(1, 47), "", "")
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 || got[1] != vectors["0"][1] {
			t.Errorf("EngineHashes(47 tokens) = %v, want 2 blocks ending in %d", got, vectors["0"][1])
		}
	})
	t.Run("cache salt changes every block, lora too", func(t *testing.T) {
		plain, _ := vllmtest.EngineHashes("0", 16, seqTokens(1, 32), "", "")
		salted, _ := vllmtest.EngineHashes("0", 16, seqTokens(1, 32), "", "s1")
		lora, _ := vllmtest.EngineHashes("0", 16, seqTokens(1, 32), "ad", "")
		for i := range plain {
			if salted[i] == plain[i] || lora[i] == plain[i] || lora[i] == salted[i] {
				t.Errorf("block %d: plain %d salted %d lora %d should all differ", i, plain[i], salted[i], lora[i])
			}
		}
	})
}

// start runs a replica that stops when the test ends.
func start(tb testing.TB, cfg vllmtest.Config) *vllmtest.Replica {
	tb.Helper()
	if cfg.Model == "" {
		cfg.Model = "sim-model"
	}
	r, err := vllmtest.New(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := r.Start(context.Background()); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := r.Stop(); err != nil {
			tb.Errorf("Stop: %v", err)
		}
	})
	return r
}

// reader pumps a socket's messages into a channel so tests can wait on them
// with a deadline; it ends when the socket closes.
func reader(sock zmq4.Socket) <-chan zmq4.Msg {
	ch := make(chan zmq4.Msg, 1024)
	go func() {
		defer close(ch)
		for {
			msg, err := sock.Recv()
			if err != nil {
				return
			}
			ch <- msg
		}
	}()
	return ch
}

func next(tb testing.TB, ch <-chan zmq4.Msg) zmq4.Msg {
	tb.Helper()
	select {
	case msg, ok := <-ch:
		if !ok {
			tb.Fatal("socket closed")
		}
		return msg
	case <-time.After(5 * time.Second):
		tb.Fatal("no message within 5s")
	}
	return zmq4.Msg{}
}

func none(tb testing.TB, ch <-chan zmq4.Msg, d time.Duration) {
	tb.Helper()
	select {
	case msg := <-ch:
		tb.Fatalf("unexpected message %q", msg.Frames)
	case <-time.After(d):
	}
}

// subscribe connects a real SUB socket and waits until the replica sees the
// subscription, so that no batch is lost to the slow-joiner effect.
func subscribe(tb testing.TB, r *vllmtest.Replica) <-chan zmq4.Msg {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sub := zmq4.NewSub(ctx)
	tb.Cleanup(func() { cancel(); sub.Close() })
	if err := sub.Dial(r.EventsEndpoint()); err != nil {
		tb.Fatal(err)
	}
	if err := sub.SetOption(zmq4.OptionSubscribe, r.Topic()); err != nil {
		tb.Fatal(err)
	}
	wctx, wcancel := context.WithTimeout(ctx, 5*time.Second)
	defer wcancel()
	if err := r.WaitSubscribed(wctx); err != nil {
		tb.Fatal(err)
	}
	return reader(sub)
}

func dealer(tb testing.TB, r *vllmtest.Replica) (zmq4.Socket, <-chan zmq4.Msg) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := zmq4.NewDealer(ctx)
	tb.Cleanup(func() { cancel(); d.Close() })
	if err := d.Dial(r.ReplayEndpoint()); err != nil {
		tb.Fatal(err)
	}
	return d, reader(d)
}

func be8(seq uint64) []byte { return binary.BigEndian.AppendUint64(nil, seq) }

// decoded is one live message, checked for the 3-frame layout.
type decoded struct {
	topic string
	seq   uint64
	raw   []byte
	ts    any
	evs   []any
	rank  any
}

func decodeBatch(tb testing.TB, topic, seq, payload []byte) decoded {
	tb.Helper()
	if len(seq) != 8 {
		tb.Fatalf("seq frame is %d bytes, want 8", len(seq))
	}
	dec := msgpack.NewDecoder(bytes.NewReader(payload))
	dec.UseLooseInterfaceDecoding(true)
	var b []any
	if err := dec.Decode(&b); err != nil {
		tb.Fatalf("decode payload: %v", err)
	}
	if len(b) != 3 {
		tb.Fatalf("batch has %d fields, want 3: %v", len(b), b)
	}
	if payload[1] != 0xcb {
		tb.Errorf("ts encoded as %#x, want float64 (0xcb)", payload[1])
	}
	evs, ok := b[1].([]any)
	if !ok {
		tb.Fatalf("events are %T, want array", b[1])
	}
	return decoded{topic: string(topic), seq: binary.BigEndian.Uint64(seq), raw: payload, ts: b[0], evs: evs, rank: b[2]}
}

func live(tb testing.TB, ch <-chan zmq4.Msg) decoded {
	tb.Helper()
	msg := next(tb, ch)
	if len(msg.Frames) != 3 {
		tb.Fatalf("live message has %d frames, want 3", len(msg.Frames))
	}
	return decodeBatch(tb, msg.Frames[0], msg.Frames[1], msg.Frames[2])
}

func u64(tb testing.TB, v any) uint64 {
	tb.Helper()
	switch n := v.(type) {
	case int64:
		return uint64(n)
	case uint64:
		return n
	case int8, int16, int32, uint8, uint16, uint32, int:
		var out uint64
		fmt.Sscan(fmt.Sprint(n), &out)
		return out
	}
	tb.Fatalf("%v is %T, want an integer", v, v)
	return 0
}

func u64s(tb testing.TB, v any) []uint64 {
	tb.Helper()
	arr, ok := v.([]any)
	if !ok {
		tb.Fatalf("%v is %T, want array", v, v)
	}
	out := make([]uint64, len(arr))
	for i, x := range arr {
		out[i] = u64(tb, x)
	}
	return out
}

func u64sOf(ints []int) []uint64 {
	out := make([]uint64, len(ints))
	for i, x := range ints {
		out[i] = uint64(x)
	}
	return out
}

// stored is a BlockStored event in either encoding.
type stored struct {
	hashes    []uint64
	parent    *uint64
	tokens    []uint64
	blockSize uint64
	medium    any
	loraName  any
	extraKeys any
}

// normalize maps either event encoding to (type, fields by name).
func normalize(tb testing.TB, encoding string, ev any) (string, map[string]any) {
	tb.Helper()
	if encoding == vllmtest.EncodingMap {
		m, ok := ev.(map[string]any)
		if !ok {
			tb.Fatalf("event is %T, want map", ev)
		}
		typ, _ := m["type"].(string)
		return typ, m
	}
	arr, ok := ev.([]any)
	if !ok || len(arr) == 0 {
		tb.Fatalf("event is %T %v, want non-empty array", ev, ev)
	}
	typ, _ := arr[0].(string)
	names := map[string][]string{
		"BlockStored":      {"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys"},
		"BlockRemoved":     {"block_hashes", "medium"},
		"AllBlocksCleared": {},
	}[typ]
	if len(arr)-1 > len(names) {
		tb.Fatalf("%s has %d fields, want at most %d", typ, len(arr)-1, len(names))
	}
	m := map[string]any{}
	for i, v := range arr[1:] {
		m[names[i]] = v
	}
	return typ, m
}

func asStored(tb testing.TB, encoding string, ev any) stored {
	tb.Helper()
	typ, m := normalize(tb, encoding, ev)
	if typ != "BlockStored" {
		tb.Fatalf("event type %q, want BlockStored", typ)
	}
	for _, k := range []string{"block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name"} {
		if _, ok := m[k]; !ok {
			tb.Errorf("BlockStored lacks %s", k)
		}
	}
	s := stored{hashes: u64s(tb, m["block_hashes"]), tokens: u64s(tb, m["token_ids"]), blockSize: u64(tb, m["block_size"]),
		medium: m["medium"], loraName: m["lora_name"], extraKeys: m["extra_keys"]}
	if m["parent_block_hash"] != nil {
		p := u64(tb, m["parent_block_hash"])
		s.parent = &p
	}
	return s
}

func asRemoved(tb testing.TB, encoding string, ev any) []uint64 {
	tb.Helper()
	typ, m := normalize(tb, encoding, ev)
	if typ != "BlockRemoved" {
		tb.Fatalf("event type %q, want BlockRemoved", typ)
	}
	if m["medium"] != "GPU" {
		tb.Errorf("BlockRemoved medium = %v, want GPU", m["medium"])
	}
	return u64s(tb, m["block_hashes"])
}

func TestEvents(t *testing.T) {
	for _, enc := range []string{vllmtest.EncodingArray, vllmtest.EncodingMap} {
		t.Run(enc, func(t *testing.T) {
			r := start(t, vllmtest.Config{EventEncoding: enc, Topic: "kv", HashSeed: "0", CapacityBlocks: 4})
			sub := subscribe(t, r)
			h, _ := vllmtest.EngineHashes("0", 16, seqTokens(1, 48), "", "")

			// Two full blocks and a partial one: only full blocks are stored.
			post(t, r.URL()+"/v1/completions", map[string]any{"prompt": seqTokens(1, 40), "max_tokens": 2}, nil)
			b := live(t, sub)
			if b.topic != "kv" || b.seq != 0 {
				t.Errorf("topic, seq = %q, %d, want kv, 0", b.topic, b.seq)
			}
			if _, ok := b.ts.(float64); !ok {
				t.Errorf("ts is %T, want float64", b.ts)
			}
			if u64(t, b.rank) != 0 {
				t.Errorf("data_parallel_rank = %v, want 0", b.rank)
			}
			if len(b.evs) != 1 {
				t.Fatalf("got %d events, want 1", len(b.evs))
			}
			s := asStored(t, enc, b.evs[0])
			if want := vectors["0"]; !reflect.DeepEqual(s.hashes, want) {
				t.Errorf("block_hashes = %v, want %v (the §4 test vector)", s.hashes, want)
			}
			if s.parent != nil {
				t.Errorf("parent_block_hash = %d, want nil", *s.parent)
			}
			if want := u64sOf(seqTokens(1, 32)); !reflect.DeepEqual(s.tokens, want) {
				t.Errorf("token_ids = %v, want %v", s.tokens, want)
			}
			if s.blockSize != 16 || s.medium != "GPU" || s.loraName != nil {
				t.Errorf("block_size, medium, lora_name = %d, %v, %v, want 16, GPU, nil", s.blockSize, s.medium, s.loraName)
			}
			if enc == vllmtest.EncodingMap {
				m := b.evs[0].(map[string]any)
				if !reflect.DeepEqual(m["extra_keys"], []any{nil, nil}) || m["kv_cache_spec_kind"] != "full_attention" || u64(t, m["group_idx"]) != 0 {
					t.Errorf("extra_keys, group_idx, kind = %v, %v, %v", m["extra_keys"], m["group_idx"], m["kv_cache_spec_kind"])
				}
			} else if raw := b.evs[0].([]any); len(raw) != 8 {
				t.Errorf("BlockStored array has %d elements, want 8", len(raw))
			}

			// The cached prefix is not stored again: the next batch carries
			// only block 2, chained to block 1.
			post(t, r.URL()+"/v1/completions", map[string]any{"prompt": seqTokens(1, 48), "max_tokens": 1}, nil)
			b = live(t, sub)
			s = asStored(t, enc, b.evs[0])
			if b.seq != 1 || !reflect.DeepEqual(s.hashes, h[2:3]) || s.parent == nil || *s.parent != h[1] {
				t.Errorf("seq %d hashes %v parent %v, want 1 %v %d", b.seq, s.hashes, s.parent, h[2:3], h[1])
			}
			if want := u64sOf(seqTokens(33, 16)); !reflect.DeepEqual(s.tokens, want) {
				t.Errorf("token_ids = %v, want %v", s.tokens, want)
			}

			// Capacity 4 holds 3; two new blocks evict one, the old prompt's
			// tail (block 2), before they are stored.
			post(t, r.URL()+"/v1/completions", map[string]any{"prompt": seqTokens(100, 32), "max_tokens": 1}, nil)
			b = live(t, sub)
			if len(b.evs) != 2 {
				t.Fatalf("got %d events, want BlockRemoved then BlockStored", len(b.evs))
			}
			if got := asRemoved(t, enc, b.evs[0]); !reflect.DeepEqual(got, h[2:3]) {
				t.Errorf("removed %v, want %v", got, h[2:3])
			}
			if s := asStored(t, enc, b.evs[1]); len(s.hashes) != 2 || s.parent != nil {
				t.Errorf("stored %v parent %v, want 2 blocks from the start", s.hashes, s.parent)
			}
			if got := r.CachedBlocks(); got != 4 {
				t.Errorf("CachedBlocks = %d, want 4", got)
			}
			if got := r.Contains(seqTokens(1, 48), ""); got != 2 {
				t.Errorf("Contains(old prompt) = %d, want 2", got)
			}

			r.ClearCache()
			b = live(t, sub)
			if typ, _ := normalize(t, enc, b.evs[0]); typ != "AllBlocksCleared" || b.seq != 3 {
				t.Errorf("got %s seq %d, want AllBlocksCleared seq 3", typ, b.seq)
			}
			if got := r.CachedBlocks(); got != 0 {
				t.Errorf("CachedBlocks after ClearCache = %d, want 0", got)
			}
		})
	}
}

func TestEventsExtraKeys(t *testing.T) {
	r := start(t, vllmtest.Config{EventEncoding: vllmtest.EncodingMap, LoRAs: []string{"ad"}, BlockSize: 4})
	sub := subscribe(t, r)
	post(t, r.URL()+"/v1/completions", map[string]any{"model": "ad", "prompt": seqTokens(1, 8), "cache_salt": "s1", "max_tokens": 1}, nil)
	b := live(t, sub)
	m := b.evs[0].(map[string]any)
	want := []any{[]any{"ad", "s1"}, []any{"ad"}}
	if !reflect.DeepEqual(m["extra_keys"], want) || m["lora_name"] != "ad" || u64(t, m["lora_id"]) != 1 {
		t.Errorf("extra_keys, lora_name, lora_id = %v, %v, %v; want %v, ad, 1", m["extra_keys"], m["lora_name"], m["lora_id"], want)
	}
	h, _ := vllmtest.EngineHashes(vllmtest.DefaultHashSeed, 4, seqTokens(1, 8), "ad", "s1")
	if got := u64s(t, m["block_hashes"]); !reflect.DeepEqual(got, h) {
		t.Errorf("block_hashes = %v, want %v", got, h)
	}
}

func TestLRU(t *testing.T) {
	r := start(t, vllmtest.Config{BlockSize: 4, CapacityBlocks: 3})
	a, b := seqTokens(1, 8), seqTokens(50, 8)
	mustAdmit(t, r, a, "", 0)
	mustAdmit(t, r, a, "", 8) // refreshes a
	mustAdmit(t, r, b, "", 0) // evicts a's tail block
	if got := r.Contains(a, ""); got != 1 {
		t.Errorf("Contains(a) = %d, want 1", got)
	}
	if got := r.Contains(b, ""); got != 2 {
		t.Errorf("Contains(b) = %d, want 2", got)
	}
	mustAdmit(t, r, a, "", 4) // block 0 hit, block 1 evicts b's tail
	if got := r.Contains(b, ""); got != 1 {
		t.Errorf("Contains(b) = %d, want 1", got)
	}
	if got := r.CachedBlocks(); got != 3 {
		t.Errorf("CachedBlocks = %d, want 3", got)
	}
	t.Run("longer than the cache", func(t *testing.T) {
		mustAdmit(t, r, seqTokens(200, 40), "", 0)
		if got := r.CachedBlocks(); got != 3 {
			t.Errorf("CachedBlocks = %d, want 3", got)
		}
	})
}

func mustAdmit(tb testing.TB, r *vllmtest.Replica, tokens []int, salt string, wantCached int) {
	tb.Helper()
	got, err := r.Admit(tokens, salt)
	if err != nil {
		tb.Fatal(err)
	}
	if got != wantCached {
		tb.Errorf("Admit cached %d tokens, want %d", got, wantCached)
	}
}

func TestReplay(t *testing.T) {
	for _, tc := range []struct {
		name    string
		noTopic bool
	}{{"with topic", false}, {"without topic", true}} {
		t.Run(tc.name, func(t *testing.T) {
			r := start(t, vllmtest.Config{Topic: "kv", BlockSize: 4, ReplayWithoutTopic: tc.noTopic})
			sub := subscribe(t, r)
			mustAdmit(t, r, seqTokens(1, 4), "", 0)
			r.DropNext(1)
			mustAdmit(t, r, seqTokens(10, 4), "", 0)
			mustAdmit(t, r, seqTokens(20, 4), "", 0)

			got := []uint64{live(t, sub).seq, live(t, sub).seq}
			if !reflect.DeepEqual(got, []uint64{0, 2}) {
				t.Fatalf("live seqs %v, want [0 2] (a gap at 1)", got)
			}

			d, replies := dealer(t, r)
			t.Run("malformed request gets no answer", func(t *testing.T) {
				if err := d.Send(zmq4.NewMsgFrom([]byte{}, []byte("abc"))); err != nil {
					t.Fatal(err)
				}
				none(t, replies, 200*time.Millisecond)
			})

			if err := d.Send(zmq4.NewMsgFrom([]byte{}, be8(1))); err != nil {
				t.Fatal(err)
			}
			var seqs []uint64
			for {
				msg := next(t, replies)
				f := msg.Frames
				if len(f) == 0 || len(f[0]) != 0 {
					t.Fatalf("reply %q does not start with an empty delimiter", f)
				}
				want := 4
				if tc.noTopic {
					want = 3
				}
				if len(f) != want {
					t.Fatalf("reply has %d frames, want %d", len(f), want)
				}
				if !tc.noTopic {
					f = f[1:] // topic
					if binary.BigEndian.Uint64(f[1]) != ^uint64(0) && string(f[0]) != "kv" {
						t.Errorf("topic %q, want kv", f[0])
					}
					f = append([][]byte{nil}, f[1:]...)
				}
				seq := binary.BigEndian.Uint64(f[1])
				if seq == ^uint64(0) {
					if len(f[2]) != 0 || (!tc.noTopic && len(msg.Frames[1]) != 0) {
						t.Errorf("end marker %q, want empty topic and payload", msg.Frames)
					}
					break
				}
				seqs = append(seqs, seq)
				b := decodeBatch(t, nil, f[1], f[2])
				if seq == 1 {
					s := asStored(t, vllmtest.EncodingArray, b.evs[0])
					if want := u64sOf(seqTokens(10, 4)); !reflect.DeepEqual(s.tokens, want) {
						t.Errorf("replayed seq 1 tokens %v, want %v", s.tokens, want)
					}
				}
			}
			if !reflect.DeepEqual(seqs, []uint64{1, 2}) {
				t.Errorf("replayed seqs %v, want [1 2]", seqs)
			}
		})
	}
}

func TestRestart(t *testing.T) {
	r := start(t, vllmtest.Config{BlockSize: 4})
	sub := subscribe(t, r)
	mustAdmit(t, r, seqTokens(1, 8), "", 0)
	mustAdmit(t, r, seqTokens(50, 8), "", 0)
	live(t, sub)
	live(t, sub)
	if got := r.Seq(); got != 2 {
		t.Fatalf("Seq = %d, want 2", got)
	}
	r.Restart()
	if got, blocks := r.Seq(), r.CachedBlocks(); got != 0 || blocks != 0 {
		t.Errorf("after Restart Seq, CachedBlocks = %d, %d, want 0, 0", got, blocks)
	}
	none(t, sub, 100*time.Millisecond) // no AllBlocksCleared

	_, replies := dealerRequest(t, r, 0)
	if msg := next(t, replies); binary.BigEndian.Uint64(msg.Frames[2]) != ^uint64(0) {
		t.Errorf("replay after Restart returned %q, want only the end marker", msg.Frames)
	}

	mustAdmit(t, r, seqTokens(1, 8), "", 0)
	if b := live(t, sub); b.seq != 0 {
		t.Errorf("first batch after Restart has seq %d, want 0", b.seq)
	}
}

func dealerRequest(tb testing.TB, r *vllmtest.Replica, from uint64) (zmq4.Socket, <-chan zmq4.Msg) {
	tb.Helper()
	d, replies := dealer(tb, r)
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, be8(from))); err != nil {
		tb.Fatal(err)
	}
	return d, replies
}

func TestStallAndDrop(t *testing.T) {
	r := start(t, vllmtest.Config{BlockSize: 4})
	sub := subscribe(t, r)
	r.Stall(300 * time.Millisecond)
	mustAdmit(t, r, seqTokens(1, 4), "", 0)
	mustAdmit(t, r, seqTokens(9, 4), "", 0)
	none(t, sub, 150*time.Millisecond)
	if a, b := live(t, sub).seq, live(t, sub).seq; a != 0 || b != 1 {
		t.Errorf("after stall got seqs %d, %d, want 0, 1", a, b)
	}
	r.DropNext(2)
	for i := range 3 {
		mustAdmit(t, r, seqTokens(100+10*i, 4), "", 0)
	}
	if got := live(t, sub).seq; got != 4 {
		t.Errorf("after DropNext(2) next live seq %d, want 4", got)
	}
}

// post sends a JSON request and decodes the JSON answer into out.
func post(tb testing.TB, url string, body any, out any) {
	tb.Helper()
	b, _ := json.Marshal(body)
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		tb.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		tb.Fatalf("POST %s: %s: %s", url, resp.Status, raw)
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			tb.Fatalf("decode %s: %v", raw, err)
		}
	}
}

type tokenizeAnswer struct {
	Count       int   `json:"count"`
	MaxModelLen int   `json:"max_model_len"`
	Tokens      []int `json:"tokens"`
	TokenStrs   any   `json:"token_strs"`
}

type usageAnswer struct {
	Usage struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
	} `json:"usage"`
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Content string `json:"content"`
		} `json:"message"`
	} `json:"choices"`
}

func TestTokenize(t *testing.T) {
	r := start(t, vllmtest.Config{BlockSize: 4})
	t.Run("text", func(t *testing.T) {
		text := "The same prompt, tokenized twice."
		var tok tokenizeAnswer
		post(t, r.URL()+"/tokenize", map[string]any{"model": "sim-model", "prompt": text, "add_special_tokens": true}, &tok)
		if !reflect.DeepEqual(tok.Tokens, r.Tokenize(text)) || tok.Count != len(tok.Tokens) || tok.MaxModelLen == 0 {
			t.Errorf("/tokenize = %+v, want tokens %v", tok, r.Tokenize(text))
		}
		var u usageAnswer
		post(t, r.URL()+"/v1/completions", map[string]any{"prompt": text, "max_tokens": 3}, &u)
		if u.Usage.PromptTokens != tok.Count || u.Usage.CompletionTokens != 3 || len(u.Choices[0].Text) != 3 {
			t.Errorf("usage %+v text %q, want %d prompt and 3 completion tokens", u.Usage, u.Choices[0].Text, tok.Count)
		}
		if got, want := r.Contains(tok.Tokens, ""), tok.Count/4; got != want {
			t.Errorf("Contains(/tokenize ids) = %d, want %d: the completion cached other ids", got, want)
		}
	})
	t.Run("chat", func(t *testing.T) {
		msgs := []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}}
		var tok tokenizeAnswer
		post(t, r.URL()+"/tokenize", map[string]any{"model": "sim-model", "messages": msgs, "add_generation_prompt": true, "add_special_tokens": false}, &tok)
		var u usageAnswer
		post(t, r.URL()+"/v1/chat/completions", map[string]any{"messages": msgs, "max_completion_tokens": 2}, &u)
		if u.Usage.PromptTokens != tok.Count || u.Choices[0].Message.Content == "" {
			t.Errorf("chat prompt_tokens %d content %q, want %d", u.Usage.PromptTokens, u.Choices[0].Message.Content, tok.Count)
		}
		if got, want := r.Contains(tok.Tokens, ""), tok.Count/4; got != want {
			t.Errorf("Contains(/tokenize chat ids) = %d, want %d", got, want)
		}
	})
}

func TestCachedTokens(t *testing.T) {
	r := start(t, vllmtest.Config{BlockSize: 16})
	prompt := strings.Repeat("a long shared system prompt. ", 4) // 116 bytes + BOS = 117 tokens
	ask := func(body map[string]any) usageAnswer {
		t.Helper()
		var u usageAnswer
		post(t, r.URL()+"/v1/completions", body, &u)
		return u
	}
	cases := []struct {
		name string
		body map[string]any
		want int
	}{
		{"cold", map[string]any{"prompt": prompt}, 0},
		{"warm", map[string]any{"prompt": prompt}, 112},
		{"longer prompt shares the prefix", map[string]any{"prompt": prompt + "and more"}, 112},
		{"other salt", map[string]any{"prompt": prompt, "cache_salt": "tenant-b"}, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := ask(tc.body).Usage.PromptTokensDetails.CachedTokens; got != tc.want {
				t.Errorf("cached_tokens = %d, want %d", got, tc.want)
			}
		})
	}
	t.Run("stream with usage", func(t *testing.T) {
		b, _ := json.Marshal(map[string]any{"prompt": prompt, "stream": true, "max_tokens": 4, "stream_options": map[string]any{"include_usage": true}})
		resp, err := http.Post(r.URL()+"/v1/completions", "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		raw, _ := io.ReadAll(resp.Body)
		chunks := strings.Split(strings.TrimSpace(string(raw)), "\n\n")
		if len(chunks) != 6 || chunks[5] != "data: [DONE]" {
			t.Fatalf("got %d chunks %q, want 4 tokens, usage, [DONE]", len(chunks), chunks)
		}
		var u usageAnswer
		if err := json.Unmarshal([]byte(strings.TrimPrefix(chunks[4], "data: ")), &u); err != nil {
			t.Fatal(err)
		}
		if u.Usage.PromptTokensDetails.CachedTokens != 112 || u.Usage.CompletionTokens != 4 {
			t.Errorf("stream usage %+v, want 112 cached, 4 completion", u.Usage)
		}
	})
}

func TestHealthMetricsDie(t *testing.T) {
	r := start(t, vllmtest.Config{Model: "m1", BlockSize: 8})
	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get(r.URL() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	t.Run("health", func(t *testing.T) {
		if code, _ := get("/health"); code != 200 {
			t.Errorf("healthy /health = %d, want 200", code)
		}
		r.SetHealthy(false)
		if code, _ := get("/health"); code != 503 {
			t.Errorf("unhealthy /health = %d, want 503", code)
		}
		r.SetHealthy(true)
	})
	t.Run("metrics", func(t *testing.T) {
		mustAdmit(t, r, seqTokens(1, 20), "", 0)
		mustAdmit(t, r, seqTokens(1, 20), "", 16)
		_, body := get("/metrics")
		for _, want := range []string{
			`vllm:num_requests_running{engine="0",model_name="m1"} 0`,
			`vllm:num_requests_waiting{engine="0",model_name="m1"} 0`,
			`vllm:prefix_cache_queries_total{engine="0",model_name="m1"} 40`,
			`vllm:prefix_cache_hits_total{engine="0",model_name="m1"} 16`,
			`vllm:kv_cache_usage_perc{engine="0",model_name="m1"} `,
			`vllm:cache_config_info{block_size="8",`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("/metrics lacks %q:\n%s", want, body)
			}
		}
	})
	t.Run("die", func(t *testing.T) {
		r.Die()
		if _, err := http.Get(r.URL() + "/health"); err == nil {
			t.Error("GET /health after Die succeeded, want an error")
		}
	})
}

func TestRunningCount(t *testing.T) {
	r := start(t, vllmtest.Config{MaxRunning: 1, PrefillTokensPerSec: 100})
	done := make(chan struct{}, 2)
	for range 2 {
		go func() {
			defer func() { done <- struct{}{} }()
			b, _ := json.Marshal(map[string]any{"prompt": seqTokens(1, 30), "max_tokens": 1})
			resp, err := http.Post(r.URL()+"/v1/completions", "application/json", bytes.NewReader(b))
			if err == nil {
				resp.Body.Close()
			}
		}()
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		resp, err := http.Get(r.URL() + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if strings.Contains(string(b), `vllm:num_requests_running{engine="0",model_name="sim-model"} 1`) &&
			strings.Contains(string(b), `vllm:num_requests_waiting{engine="0",model_name="sim-model"} 1`) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("never saw 1 running and 1 waiting:\n%s", b)
		}
		time.Sleep(5 * time.Millisecond)
	}
	<-done
	<-done
}

func TestGivenEndpoints(t *testing.T) {
	r := start(t, vllmtest.Config{EventsEndpoint: "tcp://*:0", ReplayEndpoint: "tcp://127.0.0.1:0", HTTPAddr: "127.0.0.1:0", BlockSize: 4})
	if !strings.HasPrefix(r.EventsEndpoint(), "tcp://127.0.0.1:") || strings.HasSuffix(r.EventsEndpoint(), ":0") {
		t.Errorf("EventsEndpoint = %q, want a dialable loopback endpoint", r.EventsEndpoint())
	}
	sub := subscribe(t, r)
	mustAdmit(t, r, seqTokens(1, 4), "", 0)
	if b := live(t, sub); b.seq != 0 {
		t.Errorf("seq = %d, want 0", b.seq)
	}
}

// TestBigHashEncoding checks that a hash >= 2^63 travels as msgpack uint64
// (0xcf), the form a Python publisher uses and decoders must accept.
func TestBigHashEncoding(t *testing.T) {
	r := start(t, vllmtest.Config{BlockSize: 1, CapacityBlocks: 64})
	var toks []int
	var big uint64
	for tok := 1; tok < 64 && big == 0; tok++ {
		toks = []int{tok}
		h, err := r.BlockHashes(toks, "")
		if err != nil {
			t.Fatal(err)
		}
		if h[0] >= 1<<63 {
			big = h[0]
		}
	}
	if big == 0 {
		t.Fatal("no single-token block hashed to >= 2^63")
	}
	sub := subscribe(t, r)
	mustAdmit(t, r, toks, "", 0)
	b := live(t, sub)
	want := append([]byte{0xcf}, be8(big)...)
	if !bytes.Contains(b.raw, want) {
		t.Errorf("payload %x lacks %x", b.raw, want)
	}
}

func TestChatStream(t *testing.T) {
	r := start(t, vllmtest.Config{})
	b, _ := json.Marshal(map[string]any{"messages": []map[string]any{{"role": "user", "content": []map[string]any{{"type": "text", "text": "hi"}}}}, "stream": true, "max_tokens": 3})
	resp, err := http.Post(r.URL()+"/v1/chat/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); ct != "text/event-stream" {
		t.Errorf("Content-Type = %q, want text/event-stream", ct)
	}
	raw, _ := io.ReadAll(resp.Body)
	chunks := strings.Split(strings.TrimSpace(string(raw)), "\n\n")
	if len(chunks) != 5 || chunks[4] != "data: [DONE]" {
		t.Fatalf("got %q, want role chunk, 3 tokens, [DONE]", chunks)
	}
	var text strings.Builder
	for i, c := range chunks[:4] {
		var ch struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta        map[string]any `json:"delta"`
				FinishReason *string        `json:"finish_reason"`
			} `json:"choices"`
		}
		if err := json.Unmarshal([]byte(strings.TrimPrefix(c, "data: ")), &ch); err != nil {
			t.Fatalf("chunk %d: %v", i, err)
		}
		if ch.Object != "chat.completion.chunk" || len(ch.Choices) != 1 {
			t.Fatalf("chunk %d = %s", i, c)
		}
		if i == 0 && ch.Choices[0].Delta["role"] != "assistant" {
			t.Errorf("first delta %v, want role assistant", ch.Choices[0].Delta)
		}
		if s, ok := ch.Choices[0].Delta["content"].(string); ok {
			text.WriteString(s)
		}
		if (i == 3) != (ch.Choices[0].FinishReason != nil) {
			t.Errorf("chunk %d finish_reason %v, want it only on the last", i, ch.Choices[0].FinishReason)
		}
	}
	if text.Len() != 3 {
		t.Errorf("streamed %q, want 3 bytes (max_tokens 3)", text.String())
	}
}

func TestStartContextStops(t *testing.T) {
	r, err := vllmtest.New(vllmtest.Config{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	if err := r.Start(ctx); err != nil {
		t.Fatal(err)
	}
	cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		resp, err := http.Get(r.URL() + "/health")
		if err != nil {
			break
		}
		resp.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("replica still serving 5s after its context ended")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if err := r.Stop(); err != nil {
		t.Errorf("Stop after cancel: %v", err)
	}
}

func TestNewRejects(t *testing.T) {
	for name, cfg := range map[string]vllmtest.Config{
		"no model":         {},
		"unknown encoding": {Model: "m", EventEncoding: "json"},
		"negative size":    {Model: "m", BlockSize: -1},
	} {
		t.Run(name, func(t *testing.T) {
			if _, err := vllmtest.New(cfg); err == nil {
				t.Error("New succeeded, want an error")
			}
		})
	}
}

// TestBlockEncoding checks the hand-written encoding of a block without
// extra keys against the CBOR library's canonical encoding, across every
// integer width boundary a token id or a block length can cross.
func TestBlockEncoding(t *testing.T) {
	em, err := cbor.CoreDetEncOptions().EncMode()
	if err != nil {
		t.Fatal(err)
	}
	var parent vllmtest.Digest
	for i := range parent {
		parent[i] = byte(i * 7)
	}
	edges := []int{0, 1, 23, 24, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<63 - 1}
	for _, tt := range []struct {
		name   string
		tokens []int
	}{
		{"empty", nil},
		{"one", []int{5}},
		{"edges", edges},
		{"23 tokens", make([]int, 23)},
		{"24 tokens", make([]int, 24)},
		{"256 tokens", make([]int, 256)},
		{"mixed", append(make([]int, 300), edges...)},
	} {
		t.Run(tt.name, func(t *testing.T) {
			toks := make([]uint64, len(tt.tokens))
			for i, v := range tt.tokens {
				toks[i] = uint64(v)
			}
			want, err := em.Marshal([]any{parent[:], toks, nil})
			if err != nil {
				t.Fatal(err)
			}
			if got := vllmtest.AppendBlock(nil, parent, tt.tokens); !bytes.Equal(got, want) {
				t.Errorf("encoding differs from the library's:\n got %x\nwant %x", got, want)
			}
		})
	}
}

// TestTokenEncoding checks the hand-written token lists against the
// msgpack encoder's own shortest forms, at every width boundary.
func TestTokenEncoding(t *testing.T) {
	toks := []int{0, 1, 127, 128, 255, 256, 65535, 65536, 1<<32 - 1, 1 << 32, 1<<63 - 1}
	var want bytes.Buffer
	enc := msgpack.NewEncoder(&want)
	if err := enc.EncodeArrayLen(len(toks)); err != nil {
		t.Fatal(err)
	}
	for _, v := range toks {
		if err := enc.EncodeUint(uint64(v)); err != nil {
			t.Fatal(err)
		}
	}
	if got := vllmtest.EncodeTokens(toks); !bytes.Equal(got, want.Bytes()) {
		t.Errorf("token list encoding:\n got %x\nwant %x", got, want.Bytes())
	}
}
