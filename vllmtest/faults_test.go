package vllmtest_test

import (
	"encoding/binary"
	"reflect"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/kvroute/kvroute/vllmtest"
)

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
