package infra_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// proc is a kvroute process started by a test and stopped with SIGTERM
// when it ends.
type proc struct {
	cmd  *exec.Cmd
	done chan struct{}
	mu   sync.Mutex
	out  bytes.Buffer
}

func (p *proc) Write(b []byte) (int, error) { p.mu.Lock(); defer p.mu.Unlock(); return p.out.Write(b) }

func (p *proc) logs() string { p.mu.Lock(); defer p.mu.Unlock(); return p.out.String() }

func startProc(tb testing.TB, args ...string) *proc {
	tb.Helper()
	p := &proc{cmd: exec.Command(kvrouteBinary(tb), args...), done: make(chan struct{})}
	p.cmd.Stdout, p.cmd.Stderr = p, p
	if err := p.cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	go func() { _ = p.cmd.Wait(); close(p.done) }()
	tb.Cleanup(func() {
		p.stop()
		if tb.Failed() {
			tb.Logf("kvroute %s logs:\n%s", args[0], p.logs())
		}
	})
	return p
}

// stop ends the process as Kubernetes does: SIGTERM, then SIGKILL.
func (p *proc) stop() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(15 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
}

func freeAddr(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

var client = &http.Client{Timeout: 5 * time.Second}

func call(ctx context.Context, method, url, body string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, url, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := client.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

// waitHTTP polls url until it answers 200 or the deadline passes.
func waitHTTP(tb testing.TB, p *proc, url string, within time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for {
		code, body, err := call(context.Background(), http.MethodGet, url, "")
		if err == nil && code == http.StatusOK {
			return
		}
		select {
		case <-p.done:
			tb.Fatalf("kvroute exited before %s answered:\n%s", url, p.logs())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: no 200 within %s (last: %d %s %v)", url, within, code, body, err)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// decision is the part of a /v1/route answer the tests read.
type decision struct {
	Replica struct {
		ID string `json:"id"`
	} `json:"replica"`
	MatchedBlocks int `json:"matched_blocks"`
	PromptBlocks  int `json:"prompt_blocks"`
}

func route(ctx context.Context, base, body string) (decision, error) {
	code, b, err := call(ctx, http.MethodPost, base+"/v1/route", body)
	if err != nil {
		return decision{}, err
	}
	if code != http.StatusOK {
		return decision{}, fmt.Errorf("/v1/route: %d %s", code, b)
	}
	var d decision
	return d, json.Unmarshal(b, &d)
}
