// Package dnstest starts a real DNS server for a test: dnsmasq on a free
// loopback port, answering only from records the test gives (no upstream,
// no /etc/hosts), authoritative for its domain so that a name it does not
// hold is NXDOMAIN. A records change by rewriting a hosts file and sending
// SIGHUP, which dnsmasq re-reads; SRV records are fixed at start.
//
// Without dnsmasq the test is skipped, or fails when CI is set, so that CI
// cannot pass by skipping (scripts/ensure-deps.sh installs it).
package dnstest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/wait"
)

// Domain is the zone the server answers for; every name a test uses ends
// with it.
const Domain = "kvr.test"

// SRV is one SRV record the server starts with.
type SRV struct {
	Name, Target string
	Port         int
}

// Server is a running dnsmasq.
type Server struct {
	// Addr is where it listens (UDP and TCP), 127.0.0.1:port.
	Addr  string
	hosts string
	cmd   *exec.Cmd
	mu    sync.Mutex
	out   bytes.Buffer
	done  chan struct{}
}

// Start runs dnsmasq answering hosts (name to addresses, reloadable with
// SetHosts) and srv, and stops it when the test ends.
func Start(tb testing.TB, hosts map[string][]string, srv ...SRV) *Server {
	tb.Helper()
	bin, err := exec.LookPath("dnsmasq")
	if err != nil {
		if _, serr := os.Stat("/usr/sbin/dnsmasq"); serr == nil {
			bin, err = "/usr/sbin/dnsmasq", nil
		}
	}
	if err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("dnstest: dnsmasq not installed (CI is set): %v", err)
		}
		tb.Skipf("dnstest: dnsmasq not installed (Debian: dnsmasq-base): %v", err)
	}
	dir := tb.TempDir()
	s := &Server{hosts: filepath.Join(dir, "hosts")}
	s.writeHosts(tb, hosts)
	for attempt := 0; ; attempt++ {
		port := freePort(tb)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		args := []string{"--keep-in-foreground", "--log-facility=-", "--no-resolv", "--no-hosts", "--no-poll",
			"--port=" + strconv.Itoa(port), "--listen-address=127.0.0.1", "--bind-interfaces", "--pid-file=",
			"--local=/" + Domain + "/", "--addn-hosts=" + s.hosts, "--local-ttl=0", "--cache-size=0",
			"--host-record=ready." + Domain + ",127.0.0.1"}
		if os.Geteuid() == 0 {
			// Root would otherwise drop to nobody, who cannot read the
			// test's hosts file again on SIGHUP.
			args = append(args, "--user=root")
		}
		for _, r := range srv {
			args = append(args, fmt.Sprintf("--srv-host=%s,%s,%d", r.Name, r.Target, r.Port))
		}
		s.out.Reset()
		s.cmd = exec.Command(bin, args...)
		s.cmd.Stdout, s.cmd.Stderr = &lockedWriter{s}, &lockedWriter{s}
		if err := s.cmd.Start(); err != nil {
			tb.Fatalf("dnstest: start dnsmasq: %v", err)
		}
		s.done = make(chan struct{})
		go func() { _ = s.cmd.Wait(); close(s.done) }()
		if s.ready() {
			break
		}
		_ = s.cmd.Process.Kill()
		<-s.done
		if attempt == 4 {
			tb.Fatalf("dnstest: dnsmasq did not answer:\n%s", s.output())
		}
	}
	tb.Cleanup(func() {
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.done:
		case <-time.After(5 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.done
		}
	})
	return s
}

// ready waits (bounded: a dnsmasq that has not answered in 10 s failed to
// start, on a port taken meanwhile, say) for the first answer.
func (s *Server) ready() bool {
	r := s.Resolver()
	for range 200 {
		select {
		case <-s.done:
			return false
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		addrs, err := r.LookupNetIP(ctx, "ip4", "ready."+Domain)
		cancel()
		if err == nil && len(addrs) > 0 {
			return true
		}
		time.Sleep(50 * time.Millisecond)
	}
	return false
}

// Resolver asks this server only.
func (s *Server) Resolver() *net.Resolver {
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, network, s.Addr)
	}}
}

// SetHosts replaces the A/AAAA records and returns once the server
// answers them: every name given resolves to exactly its addresses, and
// every name no longer given is NXDOMAIN.
func (s *Server) SetHosts(tb testing.TB, hosts map[string][]string) {
	tb.Helper()
	old := s.names(tb)
	s.writeHosts(tb, hosts)
	if err := s.cmd.Process.Signal(syscall.SIGHUP); err != nil {
		tb.Fatalf("dnstest: SIGHUP: %v", err)
	}
	r := s.Resolver()
	check := func() bool {
		for _, name := range old {
			if _, ok := hosts[name]; !ok {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				_, err := r.LookupNetIP(ctx, "ip", name)
				cancel()
				if err == nil {
					return false
				}
			}
		}
		for name, want := range hosts {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			got, err := r.LookupNetIP(ctx, "ip", name)
			cancel()
			if err != nil || !sameAddrs(got, want) {
				return false
			}
		}
		return true
	}
	wait.Until(tb, "dnsmasq answers the new records", func() bool {
		select {
		case <-s.done:
			tb.Fatalf("dnstest: dnsmasq exited:\n%s", s.output())
		default:
		}
		return check()
	})
}

func sameAddrs(got []netip.Addr, want []string) bool {
	var g []string
	for _, a := range got {
		g = append(g, a.Unmap().String())
	}
	w := slices.Clone(want)
	slices.Sort(g)
	slices.Sort(w)
	return slices.Equal(g, w)
}

func (s *Server) names(tb testing.TB) []string {
	b, err := os.ReadFile(s.hosts)
	if err != nil {
		tb.Fatalf("dnstest: %v", err)
	}
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) == 2 && !slices.Contains(out, f[1]) {
			out = append(out, f[1])
		}
	}
	return out
}

func (s *Server) writeHosts(tb testing.TB, hosts map[string][]string) {
	var b strings.Builder
	for name, addrs := range hosts {
		for _, a := range addrs {
			fmt.Fprintf(&b, "%s %s\n", a, name)
		}
	}
	// Written whole and renamed, so that a reload never reads half a file.
	tmp := s.hosts + ".new"
	if err := os.WriteFile(tmp, []byte(b.String()), 0o644); err != nil {
		tb.Fatalf("dnstest: %v", err)
	}
	if err := os.Rename(tmp, s.hosts); err != nil {
		tb.Fatalf("dnstest: %v", err)
	}
}

func (s *Server) output() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.out.String()
}

type lockedWriter struct{ s *Server }

func (w *lockedWriter) Write(p []byte) (int, error) {
	w.s.mu.Lock()
	defer w.s.mu.Unlock()
	return w.s.out.Write(p)
}

// freePort is a loopback port free for both UDP and TCP just now.
func freePort(tb testing.TB) int {
	tb.Helper()
	for range 20 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("dnstest: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		_ = l.Close()
		if err == nil {
			_ = u.Close()
			return port
		}
	}
	tb.Fatal("dnstest: no free port")
	return 0
}
