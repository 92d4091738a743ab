package vllmtest_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/vllmtest"
)

// genBody is a generation request for the endpoint path, with the given
// priority (omitted when nil) and output length.
func genBody(path string, priority *int, maxTokens int) map[string]any {
	b := map[string]any{"max_tokens": maxTokens}
	if strings.Contains(path, "chat") {
		b["messages"] = []map[string]string{{"role": "user", "content": "hello"}}
	} else {
		b["prompt"] = "hello"
	}
	if priority != nil {
		b["priority"] = *priority
	}
	return b
}

// send posts body and returns the status and the raw answer.
func send(ctx context.Context, url string, body any) (int, []byte, error) {
	b, _ := json.Marshal(body)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	return resp.StatusCode, raw, err
}

// waitGauges waits until the replica's /metrics reports running and
// waiting requests.
func waitGauges(tb testing.TB, r *vllmtest.Replica, running, waiting int) {
	tb.Helper()
	wantRun := fmt.Sprintf(`vllm:num_requests_running{engine="0",model_name="sim-model"} %d`, running)
	wantWait := fmt.Sprintf(`vllm:num_requests_waiting{engine="0",model_name="sim-model"} %d`, waiting)
	wait.UntilNil(tb, fmt.Sprintf("%d running and %d waiting", running, waiting), func() error {
		resp, err := http.Get(r.URL() + "/metrics")
		if err != nil {
			return err
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if strings.Contains(string(b), wantRun+"\n") && strings.Contains(string(b), wantWait+"\n") {
			return nil
		}
		return fmt.Errorf("the metrics:\n%s", b)
	})
}

// block starts a request that holds the replica's only running slot
// until the returned function cancels it.
func block(tb testing.TB, r *vllmtest.Replica, path string) (unblock func()) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _, _ = send(ctx, r.URL()+path, genBody(path, nil, 1000))
	}()
	waitGauges(tb, r, 1, 0)
	return func() { cancel(); <-done }
}

type ran struct {
	name string
	seq  int // the response id's number: the order requests ran in
	err  error
}

// queueUp sends the named requests one after another, each once the one
// before it is counted waiting (behind the already waiting before the
// first), so that their arrival order is the given one; their answers
// arrive on the channel.
func queueUp(tb testing.TB, r *vllmtest.Replica, path string, already int, names []string, priorities []int) <-chan ran {
	tb.Helper()
	out := make(chan ran, len(names))
	for i, name := range names {
		go func() {
			status, raw, err := send(context.Background(), r.URL()+path, genBody(path, &priorities[i], 0))
			if err == nil && status != http.StatusOK {
				err = fmt.Errorf("status %d: %s", status, raw)
			}
			var resp struct{ ID string }
			if err == nil {
				err = json.Unmarshal(raw, &resp)
			}
			seq, _ := strconv.Atoi(resp.ID[strings.LastIndexByte(resp.ID, '-')+1:])
			out <- ran{name: name, seq: seq, err: err}
		}()
		waitGauges(tb, r, 1, already+i+1)
	}
	return out
}

// order collects n answers and names them in the order they ran.
func order(tb testing.TB, ch <-chan ran, n int) []string {
	tb.Helper()
	var got []ran
	for range n {
		a := wait.Recv(tb, "an answer", ch)
		if a.err != nil {
			tb.Fatalf("request %s: %v", a.name, a.err)
		}
		got = append(got, a)
	}
	slices.SortFunc(got, func(a, b ran) int { return a.seq - b.seq })
	names := make([]string, len(got))
	for i, a := range got {
		names[i] = a.name
	}
	return names
}

// TestSchedulingPolicy: with one running slot, waiting requests run in
// arrival order under fcfs and in (priority, arrival) order under
// priority, on both generation endpoints, as vLLM's two scheduling
// policies order their waiting queues.
func TestSchedulingPolicy(t *testing.T) {
	tests := []struct {
		name, policy string
		priorities   []int
		want         []string
	}{
		{name: "fcfs runs in arrival order", policy: vllmtest.PolicyFCFS, priorities: []int{0, 0, 0}, want: []string{"a", "b", "c"}},
		{name: "priority runs the lowest first, then the oldest", policy: vllmtest.PolicyPriority,
			priorities: []int{5, 1, 1, -2}, want: []string{"d", "b", "c", "a"}},
	}
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		for _, tt := range tests {
			t.Run(path+"/"+tt.name, func(t *testing.T) {
				r := start(t, vllmtest.Config{MaxRunning: 1, DecodeTokensPerSec: 1, SchedulingPolicy: tt.policy})
				unblock := block(t, r, path)
				names := []string{"a", "b", "c", "d"}[:len(tt.priorities)]
				ch := queueUp(t, r, path, 0, names, tt.priorities)
				unblock()
				if got := order(t, ch, len(names)); !reflect.DeepEqual(got, tt.want) {
					t.Errorf("ran in order %v, want %v", got, tt.want)
				}
				waitGauges(t, r, 0, 0)
			})
		}
	}
}

// TestPriorityRefusedUnderFCFS: a request with a non-zero priority to a
// replica that does not schedule by priority gets vLLM's 400, on both
// generation endpoints; priority 0 is every request's default and is
// accepted.
func TestPriorityRefusedUnderFCFS(t *testing.T) {
	r := start(t, vllmtest.Config{})
	for _, path := range []string{"/v1/completions", "/v1/chat/completions"} {
		t.Run(path+"/non-zero", func(t *testing.T) {
			p := 3
			status, raw, err := send(context.Background(), r.URL()+path, genBody(path, &p, 1))
			if err != nil {
				t.Fatal(err)
			}
			var got struct {
				Error struct {
					Message, Type string
					Param         any
					Code          int
				}
			}
			if err := json.Unmarshal(raw, &got); err != nil {
				t.Fatalf("decode %s: %v", raw, err)
			}
			want := "Got priority 3 but Priority scheduling is not enabled."
			if status != http.StatusBadRequest || got.Error.Message != want || got.Error.Type != "BadRequestError" ||
				got.Error.Code != 400 || got.Error.Param != nil {
				t.Errorf("got %d %s, want 400 with a BadRequestError saying %q", status, raw, want)
			}
		})
		t.Run(path+"/zero", func(t *testing.T) {
			p := 0
			if status, raw, err := send(context.Background(), r.URL()+path, genBody(path, &p, 1)); err != nil || status != http.StatusOK {
				t.Errorf("priority 0: got %d %s (%v), want 200", status, raw, err)
			}
		})
	}
}

// TestWaitingClientLeaves: a waiting request whose client goes away
// leaves the queue (the waiting gauge drops) and does not hold up the
// ones behind it.
func TestWaitingClientLeaves(t *testing.T) {
	r := start(t, vllmtest.Config{MaxRunning: 1, DecodeTokensPerSec: 1, SchedulingPolicy: vllmtest.PolicyPriority})
	unblock := block(t, r, "/v1/completions")
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error, 1)
	go func() {
		_, _, err := send(ctx, r.URL()+"/v1/completions", genBody("/v1/completions", new(int), 0))
		left <- err
	}()
	waitGauges(t, r, 1, 1)
	// One is waiting already: queueUp waits for the second. (Waiting for
	// "one waiting" again raced the second's arrival: the gauge read 2
	// and never 1 again.)
	ch := queueUp(t, r, "/v1/completions", 1, []string{"after"}, []int{1})
	cancel()
	if err := wait.Recv(t, "the leaving client's error", left); err == nil {
		t.Error("the cancelled request succeeded, want an error")
	}
	waitGauges(t, r, 1, 1)
	unblock()
	if got := order(t, ch, 1); !reflect.DeepEqual(got, []string{"after"}) {
		t.Errorf("ran %v, want [after]", got)
	}
	waitGauges(t, r, 0, 0)
}

// TestUnknownSchedulingPolicy: New refuses a policy vLLM does not have.
func TestUnknownSchedulingPolicy(t *testing.T) {
	_, err := vllmtest.New(vllmtest.Config{Model: "m", SchedulingPolicy: "lifo"})
	if err == nil || !strings.Contains(err.Error(), "scheduling policy") {
		t.Errorf("New with policy lifo = %v, want a scheduling policy error", err)
	}
}
