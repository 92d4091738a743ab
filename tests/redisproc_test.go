package tests_test

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"syscall"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute/internal/wait"
)

// redisProc is a redis-server process this test controls: it can be
// frozen (SIGSTOP), thawed, killed and started again on the same port,
// empty, as an operator's Redis without persistence would come back.
type redisProc struct {
	t    *testing.T
	port int
	cmd  *exec.Cmd
}

func startRedisProc(t *testing.T) *redisProc {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	p := &redisProc{t: t, port: port}
	p.start()
	t.Cleanup(func() { p.kill(syscall.SIGKILL) })
	return p
}

func (p *redisProc) url() string { return "redis://127.0.0.1:" + strconv.Itoa(p.port) }

// start runs redis-server with no persistence, so a restart is empty.
func (p *redisProc) start() {
	p.t.Helper()
	p.cmd = exec.Command("redis-server", "--port", strconv.Itoa(p.port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", p.t.TempDir())
	if err := p.cmd.Start(); err != nil {
		p.t.Fatalf("redis-server: %v", err)
	}
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(p.port)})
	defer c.Close()
	wait.UntilNil(p.t, "redis-server to answer", func() error { return c.Ping(context.Background()).Err() })
	p.t.Logf("real redis-server (controlled) at 127.0.0.1:%d, pid %d", p.port, p.cmd.Process.Pid)
}

// kill sends sig; for SIGKILL it waits for the process to end.
func (p *redisProc) kill(sig syscall.Signal) {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Signal(sig)
	if sig == syscall.SIGKILL || sig == syscall.SIGTERM {
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Wait()
		p.cmd = nil
	}
}

// flushall empties the server as FLUSHALL (or a failover to an empty
// replica) would.
func (p *redisProc) flushall() {
	p.t.Helper()
	c := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", p.port)})
	defer c.Close()
	if err := c.FlushAll(context.Background()).Err(); err != nil {
		p.t.Fatal(err)
	}
}
