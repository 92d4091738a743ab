package vllmtest_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvroute/kvroute/vllmtest"
)

// Helpers shared by the tests of every role: a started replica, sockets to
// its event and replay endpoints, and readers of its msgpack batches that
// are independent of kvroute's decoder.

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

// seqTokens returns n consecutive token ids from from.
func seqTokens(from, n int) []int {
	ts := make([]int, n)
	for i := range ts {
		ts[i] = from + i
	}
	return ts
}

// mustAdmit admits tokens without HTTP and checks how many were cached.
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

// next waits for the next message on ch, failing the test after 5s so that
// a lost message cannot hang it.
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

// none checks that nothing arrives on ch for d: a dropped or stalled batch
// must stay off the wire.
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
	sub := dial(tb, zmq4.NewSub, r.EventsEndpoint())
	if err := sub.SetOption(zmq4.OptionSubscribe, r.Topic()); err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.WaitSubscribed(ctx); err != nil {
		tb.Fatal(err)
	}
	return reader(sub)
}

// dealer connects a DEALER to the replica's replay socket, as the ingestor
// does, and returns it with the channel its replies arrive on.
func dealer(tb testing.TB, r *vllmtest.Replica) (zmq4.Socket, <-chan zmq4.Msg) {
	tb.Helper()
	d := dial(tb, zmq4.NewDealer, r.ReplayEndpoint())
	return d, reader(d)
}

// dial opens a socket of the kind newSocket makes and dials endpoint; the
// socket closes when the test ends.
func dial(tb testing.TB, newSocket func(context.Context, ...zmq4.Option) zmq4.Socket, endpoint string) zmq4.Socket {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := newSocket(ctx)
	tb.Cleanup(func() { cancel(); s.Close() })
	if err := s.Dial(endpoint); err != nil {
		tb.Fatal(err)
	}
	return s
}

// dealerRequest asks the replay socket for every batch from seq from on.
func dealerRequest(tb testing.TB, r *vllmtest.Replica, from uint64) (zmq4.Socket, <-chan zmq4.Msg) {
	tb.Helper()
	d, replies := dealer(tb, r)
	if err := d.Send(zmq4.NewMsgFrom([]byte{}, be8(from))); err != nil {
		tb.Fatal(err)
	}
	return d, replies
}

// be8 is a sequence number as its frame carries it: 8 bytes, big-endian.
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

// decodeBatch decodes one batch with the msgpack library's generic decoder,
// not kvroute's, so that the replica is checked against the wire format
// rather than against the code it is meant to test.
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

// live waits for the next live message on ch and decodes it.
func live(tb testing.TB, ch <-chan zmq4.Msg) decoded {
	tb.Helper()
	msg := next(tb, ch)
	if len(msg.Frames) != 3 {
		tb.Fatalf("live message has %d frames, want 3", len(msg.Frames))
	}
	return decodeBatch(tb, msg.Frames[0], msg.Frames[1], msg.Frames[2])
}

// u64 reads a decoded msgpack integer of any width.
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

// u64s reads a decoded msgpack array of integers.
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

// u64sOf is ints as u64s reads them back.
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

// asStored reads a BlockStored event of either encoding, checking that every
// field vLLM always sends is there.
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

// asRemoved reads a BlockRemoved event of either encoding and returns its
// hashes.
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
