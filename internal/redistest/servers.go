package redistest

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute/internal/syncbuf"
)

// The servers here are for the topologies and settings a store is opened
// with (TLS, ACL users, Sentinel): real redis-server processes started for
// one test on loopback, stopped when it ends. Like Server, they skip the
// test without redis-server, or fail it when CI is set.

// process is a server run started, killed when the test ends if still up.
type process struct {
	addr   string
	cmd    *exec.Cmd
	exited chan error
}

// kill stops the process with SIGKILL (a crash) and waits for it.
func (p *process) kill() {
	_ = p.cmd.Process.Kill()
	err := <-p.exited
	p.exited <- err
}

// run starts a redis-server with the arguments args gives for a free port
// and a data directory of its own, and waits until probe, given its
// address, succeeds. A port taken between picking and binding is retried.
func run(tb testing.TB, what string, args func(port int, dir string) []string, probe func(ctx context.Context, addr string) (int, string, error)) *process {
	tb.Helper()
	bin := lookPath(tb, "redis-server")
	var last error
	for range 5 {
		port, err := freePort()
		if err != nil {
			tb.Fatal(err)
		}
		dir := tb.TempDir()
		cmd := exec.Command(bin, args(port, dir)...)
		cmd.Dir = dir
		out := &syncbuf.Buffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			tb.Fatalf("redistest: %s: %v", what, err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		var version string
		version, last = waitProbe(exited, out, addr, cmd.Process.Pid, probe)
		if last == nil {
			p := &process{addr: addr, cmd: cmd, exited: exited}
			tb.Cleanup(p.kill)
			// "real redis-server <version> ... at <addr>": the line CI's
			// summary counts (scripts/test.sh).
			name, detail, _ := strings.Cut(what, " ")
			label := "real " + name + " " + version
			if detail != "" {
				label += " " + detail
			}
			tb.Logf("%s at %s", label, addr)
			return p
		}
		_ = cmd.Process.Kill()
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
		}
	}
	tb.Fatalf("redistest: starting %s: %v", what, last)
	return nil
}

// waitProbe waits until probe reaches the server at addr and finds it is
// process pid: a port another server took after it was picked answers
// too, and must not be taken for ours.
func waitProbe(exited chan error, out *syncbuf.Buffer, addr string, pid int, probe func(ctx context.Context, addr string) (int, string, error)) (string, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-exited:
			exited <- err
			return "", fmt.Errorf("exited: %v: %s", err, out.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		got, version, err := probe(ctx, addr)
		cancel()
		if err == nil && got != pid {
			return "", fmt.Errorf("%s answers as process %d, not the %d started: the port was taken", addr, got, pid)
		}
		if err == nil {
			return version, nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("not ready at %s: %v: %s", addr, err, out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// serverPID is a probe: the process id and version the server at addr
// reports, asked with o's credentials and TLS settings.
func serverPID(o *redis.Options) func(ctx context.Context, addr string) (int, string, error) {
	return func(ctx context.Context, addr string) (int, string, error) {
		opt := *o
		opt.Addr, opt.MaxRetries = addr, -1
		c := redis.NewClient(&opt)
		defer c.Close()
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			return 0, "", err
		}
		pid, err := strconv.Atoi(infoField(info, "process_id"))
		return pid, infoField(info, "redis_version"), err
	}
}

// TLSFiles are the PEM files of a test CA, a server certificate it signed
// (for 127.0.0.1 and localhost) and a client certificate it signed.
type TLSFiles struct {
	CA                    string
	ServerCert, ServerKey string
	ClientCert, ClientKey string
	OtherCA               string // a CA that signed neither
}

// NewTLSFiles writes a fresh CA, server and client certificates (ECDSA
// P-256, valid for an hour) into a temporary directory.
func NewTLSFiles(tb testing.TB) TLSFiles {
	tb.Helper()
	dir := tb.TempDir()
	write := func(name, typ string, der []byte) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
			tb.Fatal(err)
		}
		return p
	}
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			tb.Fatal(err)
		}
		return k
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		b, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			tb.Fatal(err)
		}
		return b
	}
	serial := int64(1)
	newCA := func(name string) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		k := key()
		serial++
		t := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature}
		der, err := x509.CreateCertificate(rand.Reader, t, t, &k.PublicKey, k)
		if err != nil {
			tb.Fatal(err)
		}
		c, err := x509.ParseCertificate(der)
		if err != nil {
			tb.Fatal(err)
		}
		return c, k, der
	}
	ca, caKey, caDER := newCA("kvroute test CA")
	_, _, otherDER := newCA("kvroute other CA")
	leaf := func(name string, usage x509.ExtKeyUsage) ([]byte, []byte) {
		k := key()
		serial++
		t := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Minute), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			DNSNames: []string{"localhost"}, IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
		der, err := x509.CreateCertificate(rand.Reader, t, ca, &k.PublicKey, caKey)
		if err != nil {
			tb.Fatal(err)
		}
		return der, keyDER(k)
	}
	sDER, sKey := leaf("redis", x509.ExtKeyUsageServerAuth)
	cDER, cKey := leaf("kvroute", x509.ExtKeyUsageClientAuth)
	return TLSFiles{
		CA:         write("ca.pem", "CERTIFICATE", caDER),
		OtherCA:    write("other-ca.pem", "CERTIFICATE", otherDER),
		ServerCert: write("server.pem", "CERTIFICATE", sDER),
		ServerKey:  write("server-key.pem", "EC PRIVATE KEY", sKey),
		ClientCert: write("client.pem", "CERTIFICATE", cDER),
		ClientKey:  write("client-key.pem", "EC PRIVATE KEY", cKey),
	}
}

// TLSServer starts a redis-server that speaks only TLS and requires a
// client certificate its CA signed (tls-auth-clients yes), and returns its
// address and the files to reach it with.
func TLSServer(tb testing.TB) (addr string, files TLSFiles) {
	tb.Helper()
	files = NewTLSFiles(tb)
	cert, err := tls.LoadX509KeyPair(files.ClientCert, files.ClientKey)
	if err != nil {
		tb.Fatal(err)
	}
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(files.CA)
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		tb.Fatalf("redistest: test CA: %v", err)
	}
	probe := serverPID(&redis.Options{TLSConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, ServerName: "127.0.0.1"}})
	addr = run(tb, "redis-server (TLS only, client certificates required)", func(port int, dir string) []string {
		return []string{"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--tls-cert-file", files.ServerCert, "--tls-key-file", files.ServerKey,
			"--tls-ca-cert-file", files.CA, "--tls-auth-clients", "yes",
			"--save", "", "--appendonly", "no", "--dir", dir}
	}, probe).addr
	return addr, files
}

// ACLServer starts a redis-server whose only user is user with password
// (the default user is off), and returns its address.
func ACLServer(tb testing.TB, user, password string) string {
	tb.Helper()
	return run(tb, "redis-server (ACL user "+user+", default user off)", func(port int, dir string) []string {
		return []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--user", "default", "off",
			"--user", user, "on", ">" + password, "~*", "&*", "+@all",
			"--save", "", "--appendonly", "no", "--dir", dir}
	}, serverPID(&redis.Options{Username: user, Password: password})).addr
}

// Replica starts a redis-server replicating primary (host:port) and
// returns its address once it has synced.
func Replica(tb testing.TB, primary string) string {
	tb.Helper()
	host, port, err := net.SplitHostPort(primary)
	if err != nil {
		tb.Fatalf("redistest: replica of %q: %v", primary, err)
	}
	// A primary's default waits 5 s for more replicas before a diskless
	// sync.
	pc := redis.NewClient(&redis.Options{Addr: primary})
	_ = pc.ConfigSet(context.Background(), "repl-diskless-sync-delay", "0").Err()
	pc.Close()
	addr := run(tb, "redis-server (replica)", func(p int, dir string) []string {
		return []string{"--port", strconv.Itoa(p), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
			"--dir", dir, "--protected-mode", "no", "--replicaof", host, port}
	}, serverPID(&redis.Options{})).addr
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		info, err := rc.Info(context.Background(), "replication").Result()
		if err == nil && infoField(info, "master_link_status") == "up" {
			return addr
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: replica %s of %s not synced after 20s (%v)", addr, primary, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// SentinelSet is a primary, its replica and one Sentinel watching them
// under the name Master (quorum 1, a primary declared down after 2 s).
type SentinelSet struct {
	Sentinel, Primary, Replica string
	Master                     string
	primary                    *process
}

// KillPrimary crashes the primary (SIGKILL): the Sentinel declares it
// down after 2 s and promotes the replica.
func (s SentinelSet) KillPrimary(tb testing.TB) {
	tb.Helper()
	s.primary.kill()
	tb.Logf("redistest: Sentinel's primary %s killed", s.Primary)
}

// Sentinels starts a SentinelSet and waits until the Sentinel knows the
// replica, so that a failover has somewhere to go. The primary syncs its
// replica at once (no diskless-sync delay), and the Sentinel takes it for
// down after 2 s of silence: soon enough for a test that kills it, late
// enough that a loaded machine's stall does not fail it over unasked.
func Sentinels(tb testing.TB) SentinelSet {
	tb.Helper()
	plain := func(port int, dir string, extra ...string) []string {
		return append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", dir, "--protected-mode", "no"}, extra...)
	}
	s := SentinelSet{Master: "kvroute-test"}
	s.primary = run(tb, "redis-server (Sentinel's primary)", func(port int, dir string) []string {
		return plain(port, dir, "--repl-diskless-sync-delay", "0")
	}, serverPID(&redis.Options{}))
	s.Primary = s.primary.addr
	host, pport, _ := net.SplitHostPort(s.Primary)
	s.Replica = run(tb, "redis-server (Sentinel's replica)", func(port int, dir string) []string {
		return plain(port, dir, "--replicaof", host, pport)
	}, serverPID(&redis.Options{})).addr
	s.Sentinel = run(tb, "redis-sentinel", func(port int, dir string) []string {
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\nprotected-mode no\ndir %s\n"+
			"sentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %[3]s 2000\n"+
			"sentinel failover-timeout %[3]s 5000\n", port, dir, s.Master, host, pport)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			tb.Fatal(err)
		}
		return []string{conf, "--sentinel"}
	}, serverPID(&redis.Options{})).addr
	sc := redis.NewSentinelClient(&redis.Options{Addr: s.Sentinel})
	defer sc.Close()
	deadline := time.Now().Add(20 * time.Second)
	for {
		reps, err := sc.Replicas(context.Background(), s.Master).Result()
		if err == nil && len(reps) > 0 {
			ok := false
			for _, r := range reps {
				if r["flags"] == "slave" && r["master-link-status"] == "ok" {
					ok = true
				}
			}
			if ok {
				return s
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: the Sentinel never saw a healthy replica: %v %v", reps, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
