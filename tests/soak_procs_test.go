package tests_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/wait"
)

// soakProc is one kvroute process the soak can SIGKILL and start again
// with the same flags (so on the same ports), as a supervisor would.
type soakProc struct {
	t    *testing.T
	bin  string
	args []string
	log  *os.File
	cmd  *exec.Cmd
	// gen counts the kills, so that a client can tell a request cut by a
	// kill of this process from a fault of the router.
	gen atomic.Int64
	// down is set from the kill until the process answers again.
	down atomic.Bool
}

// soakLogDirs holds each soak test's process-log directory.
var soakLogDirs sync.Map // *testing.T -> string

// soakLogDir is the directory t's processes log to. It is removed when t
// passes and kept when it fails, its path logged: a broken invariant is
// diagnosed from what the ingestors and pods said, after the test ended.
func soakLogDir(t *testing.T) string {
	t.Helper()
	if d, ok := soakLogDirs.Load(t); ok {
		return d.(string)
	}
	d, err := os.MkdirTemp("", "kvroute-soak-")
	if err != nil {
		t.Fatal(err)
	}
	soakLogDirs.Store(t, d)
	// Registered before the processes' own cleanups, so run after them:
	// every log is complete by then.
	t.Cleanup(func() {
		soakLogDirs.Delete(t)
		if t.Failed() {
			t.Logf("the processes' logs are kept in %s", d)
			return
		}
		os.RemoveAll(d)
	})
	return d
}

// startSoakProc starts bin with args, stderr appended to a log file that
// survives restarts, stopped (SIGTERM, then SIGKILL) when t ends.
func startSoakProc(t *testing.T, bin, name string, args ...string) *soakProc {
	t.Helper()
	logf, err := os.Create(filepath.Join(soakLogDir(t), name+".log"))
	if err != nil {
		t.Fatal(err)
	}
	p := &soakProc{t: t, bin: bin, args: append(args, "--log-format", "json"), log: logf}
	p.start()
	t.Cleanup(func() {
		if p.cmd != nil {
			_ = p.cmd.Process.Signal(syscall.SIGTERM)
			done := make(chan struct{})
			go func() { _ = p.cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				_ = p.cmd.Process.Kill()
				<-done
			}
		}
		logf.Close()
	})
	return p
}

func (p *soakProc) start() {
	p.t.Helper()
	cmd := exec.Command(p.bin, p.args...)
	cmd.Stdout, cmd.Stderr = io.Discard, p.log
	if err := cmd.Start(); err != nil {
		p.t.Fatalf("start %v: %v", p.args, err)
	}
	p.cmd = cmd
}

// kill9 SIGKILLs the process and reaps it.
func (p *soakProc) kill9() {
	p.down.Store(true)
	p.gen.Add(1)
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	_ = p.cmd.Wait()
	p.cmd = nil
}

// restart starts the process again and waits until url answers 200.
func (p *soakProc) restart(url string) {
	p.t.Helper()
	p.start()
	wait.UntilNil(p.t, url+" answers again", func() error { return getOK(url) })
	p.down.Store(false)
}

// soakAddr is a loopback host:port picked free now.
func soakAddr(t *testing.T) string { return "127.0.0.1:" + strconv.Itoa(freePort(t)) }

// getJSON GETs url into v, which must answer 200.
func getJSON(url string, v any) error {
	resp, err := http.Get(url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		raw, _ := io.ReadAll(resp.Body)
		return fmt.Errorf("GET %s: %d %s", url, resp.StatusCode, raw)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
