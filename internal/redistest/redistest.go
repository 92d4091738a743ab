// Package redistest gives tests a Redis to talk to: a real redis-server
// started for the test (the behaviour production sees, Lua included) or an
// in-process miniredis (fast, for unit tests that need no real server).
package redistest

import (
	"bufio"
	"context"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// EnvURL names a Redis to use instead of starting one; it is flushed first.
const EnvURL = "KVROUTE_TEST_REDIS_URL"

// Server returns the redis:// URL of a real redis-server started for this
// test on a free loopback port, without persistence, and stopped when the
// test ends. When KVROUTE_TEST_REDIS_URL is set, that server is flushed and
// used instead. Without redis-server the test is skipped, or fails when CI
// is set, so that CI cannot pass by skipping.
func Server(tb testing.TB) string {
	tb.Helper()
	if url := os.Getenv(EnvURL); url != "" {
		flush(tb, url)
		return url
	}
	if _, err := exec.LookPath("redis-server"); err != nil && os.Getenv("CI") == "" {
		tb.Skipf("redistest: redis-server not installed; install it or set %s", EnvURL)
	}
	return "redis://" + run(tb, "redis-server", func(port int, dir string) []string {
		return []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--protected-mode", "no", "--dir", dir}
	}, serverPID(&redis.Options{})).addr
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func infoField(info, name string) string {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return "?"
}

func flush(tb testing.TB, url string) {
	tb.Helper()
	o, err := redis.ParseURL(url)
	if err != nil {
		tb.Fatalf("redistest: %s: %v", EnvURL, err)
	}
	c := redis.NewClient(o)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		tb.Fatalf("redistest: %s=%s: %v", EnvURL, url, err)
	}
	if err := c.FlushAll(ctx).Err(); err != nil {
		tb.Fatalf("redistest: flushall %s: %v", url, err)
	}
	tb.Logf("real redis-server %s at %s (from %s)", infoField(info, "redis_version"), o.Addr, EnvURL)
}

// Miniredis returns the redis:// URL of an in-process miniredis that lives
// as long as the test. It runs Lua, but it is not Redis: tests of anything
// performance- or semantics-critical should also run on Server.
func Miniredis(tb testing.TB) string {
	tb.Helper()
	m := miniredis.RunT(tb)
	return "redis://" + m.Addr()
}

// WaitExists waits until the server at addr holds key: a replica has
// received what its primary was written, before a test promotes it or
// reads from it.
func WaitExists(tb testing.TB, addr, key string, within time.Duration) {
	tb.Helper()
	rc := redis.NewClient(&redis.Options{Addr: addr})
	defer rc.Close()
	for deadline := time.Now().Add(within); ; time.Sleep(20 * time.Millisecond) {
		if n, _ := rc.Exists(context.Background(), key).Result(); n == 1 {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: %s never held %s", addr, key)
		}
	}
}
