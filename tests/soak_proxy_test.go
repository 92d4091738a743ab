package tests_test

import (
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// faultProxy is a TCP proxy on loopback in front of one replica's HTTP
// port, so that the soak can degrade the pod→replica link: while delay is
// set every new connection waits that long before its first byte goes
// up; while reset is set every new connection is reset (RST) at once.
type faultProxy struct {
	ln       net.Listener
	upstream string
	delay    atomic.Int64 // nanoseconds
	reset    atomic.Bool
	wg       sync.WaitGroup
	mu       sync.Mutex
	conns    map[*net.TCPConn]bool // the client sides open now
}

// startFaultProxy proxies a fresh loopback port to upstream until t ends.
func startFaultProxy(t *testing.T, upstream string) *faultProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{ln: ln, upstream: upstream, conns: map[*net.TCPConn]bool{}}
	p.wg.Go(p.accept)
	t.Cleanup(func() { ln.Close(); p.resetAll(); p.wg.Wait() })
	return p
}

func (p *faultProxy) addr() string { return p.ln.Addr().String() }

func (p *faultProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Go(func() { p.serve(c.(*net.TCPConn)) })
	}
}

// resetAll resets every connection open now (in-flight responses are
// cut), as a link failure would.
func (p *faultProxy) resetAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for c := range p.conns {
		_ = c.SetLinger(0)
		_ = c.Close()
	}
}

func (p *faultProxy) serve(c *net.TCPConn) {
	p.mu.Lock()
	p.conns[c] = true
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
		c.Close()
	}()
	if p.reset.Load() {
		_ = c.SetLinger(0) // Close sends RST.
		return
	}
	if d := time.Duration(p.delay.Load()); d > 0 {
		time.Sleep(d) // the injected latency itself
	}
	up, err := net.Dial("tcp", p.upstream)
	if err != nil {
		_ = c.SetLinger(0)
		return
	}
	defer up.Close()
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(up, c); up.(*net.TCPConn).CloseWrite(); done <- struct{}{} }()
	go func() { _, _ = io.Copy(c, up); c.CloseWrite(); done <- struct{}{} }()
	<-done
	<-done
}
