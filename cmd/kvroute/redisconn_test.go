package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/store"
	"github.com/redis/go-redis/v9"
)

// serveAndAnswer runs a kvroute command line until url answers 200, then
// stops it as SIGTERM would and wants exit code 0: the command reached
// its Redis with the settings given (serve's /readyz and ingest's /healthz
// need the store to answer at start).
func serveAndAnswer(t *testing.T, url string, args ...string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan int, 1)
	go func() { done <- run(ctx, args, io.Discard, io.Discard) }()
	wait.UntilNil(t, url+" to answer 200", func() error {
		select {
		case code := <-done:
			t.Fatalf("kvroute %s exited with %d before %s answered", args[0], code, url)
		default:
		}
		resp, err := http.Get(url)
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			return fmt.Errorf("status %d", resp.StatusCode)
		}
		return nil
	})
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("kvroute %s exit code %d, want 0", args[0], code)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("kvroute %s did not stop", args[0])
	}
}

func freeListen(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// TestRedisSettings runs serve and ingest against real servers that
// require TLS client certificates or an ACL user, set by flags for one
// command and by environment variables for the other: both commands take
// the same settings.
func TestRedisSettings(t *testing.T) {
	t.Run("TLS with a client certificate", func(t *testing.T) {
		addr, f := redistest.TLSServer(t)
		listen := freeListen(t)
		serveAndAnswer(t, "http://"+listen+"/readyz", "serve", "--listen", listen, "--redis-url", "rediss://"+addr,
			"--redis-tls-ca", f.CA, "--redis-tls-cert", f.ClientCert, "--redis-tls-key", f.ClientKey)
		t.Setenv("KVROUTE_REDIS_URL", "rediss://"+addr)
		t.Setenv("KVROUTE_REDIS_TLS_CA", f.CA)
		t.Setenv("KVROUTE_REDIS_TLS_CERT", f.ClientCert)
		t.Setenv("KVROUTE_REDIS_TLS_KEY", f.ClientKey)
		metrics := freeListen(t)
		serveAndAnswer(t, "http://"+metrics+"/healthz", "ingest", "--metrics-listen", metrics, "--owner", "tls")
	})
	t.Run("ACL user, password from a file or the environment", func(t *testing.T) {
		addr := redistest.ACLServer(t, "kvroute", "s3cret")
		file := filepath.Join(t.TempDir(), "password")
		if err := os.WriteFile(file, []byte("s3cret\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		listen := freeListen(t)
		serveAndAnswer(t, "http://"+listen+"/readyz", "serve", "--listen", listen, "--redis-url", "redis://"+addr,
			"--redis-username", "kvroute", "--redis-password-file", file)
		t.Setenv("KVROUTE_REDIS_URL", "redis://"+addr)
		t.Setenv("KVROUTE_REDIS_USERNAME", "kvroute")
		t.Setenv("KVROUTE_REDIS_PASSWORD", "s3cret")
		metrics := freeListen(t)
		serveAndAnswer(t, "http://"+metrics+"/healthz", "ingest", "--metrics-listen", metrics, "--owner", "acl")
	})
	t.Run("a wrong password fails the start", func(t *testing.T) {
		addr := redistest.ACLServer(t, "kvroute", "s3cret")
		code := run(context.Background(), []string{"ingest", "--redis-url", "redis://" + addr, "--redis-username", "kvroute",
			"--redis-password", "wrong", "--metrics-listen", freeListen(t)}, io.Discard, io.Discard)
		if code != 1 {
			t.Errorf("exit code %d, want 1", code)
		}
	})
}

// TestServeReadReplica runs `kvroute serve --redis-read-url` against a
// real primary and its replica: decisions are cache-aware over the index
// written to the primary, and their lookups are read from the replica.
func TestServeReadReplica(t *testing.T) {
	primary := strings.TrimPrefix(redistest.Server(t), "redis://")
	replica := redistest.Replica(t, primary)
	ctx := context.Background()
	st, err := store.Open(ctx, "redis://"+primary, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	const m = "read-model"
	for _, id := range []string{"r0", "r1"} {
		if err := st.PutReplica(ctx, kvroute.Replica{ID: id, Model: m, URL: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:1"}); err != nil {
			t.Fatal(err)
		}
	}
	tokens := make([]uint32, 4*kvroute.DefaultBlockSize)
	for i := range tokens {
		tokens[i] = uint32(1000 + i)
	}
	var ops []kvroute.IndexOp
	parent := kvroute.NoParent
	for _, k := range kvroute.BlockKeys(kvroute.KeySpace{Model: m}, kvroute.DefaultBlockSize, tokens, nil) {
		ops = append(ops, kvroute.IndexOp{Kind: kvroute.OpStore, EngineHash: uint64(k) ^ 1, Key: k, Parent: parent})
		parent = k
	}
	if _, err := st.Apply(ctx, m, "r0", 1, ops); err != nil {
		t.Fatal(err)
	}
	redistest.WaitExists(t, replica, "kvr:{m:"+m+"}:blk", 10*time.Second)
	rc := redis.NewClient(&redis.Options{Addr: replica})
	defer rc.Close()
	hmgets := func() int64 {
		info, err := rc.Info(ctx, "commandstats").Result()
		if err != nil {
			t.Fatal(err)
		}
		_, rest, _ := strings.Cut(info, "cmdstat_hmget:calls=")
		n, _ := strconv.ParseInt(rest[:max(strings.IndexByte(rest, ','), 0)], 10, 64)
		return n
	}

	listen := freeListen(t)
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- run(sctx, []string{"serve", "--listen", listen, "--redis-url", "redis://" + primary, "--redis-read-url", "redis://" + replica}, io.Discard, io.Discard)
	}()
	base := "http://" + listen
	wait.Until(t, "serve to be ready", func() bool {
		resp, err := http.Get(base + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	body, _ := json.Marshal(map[string]any{"model": m, "token_ids": tokens, "max_tokens": 8})
	var before int64
	// The first decision's lookup reads from the primary (the pod has not
	// seen the model's slots yet); the next three from the replica.
	for i := range 4 {
		if i == 1 {
			before = hmgets()
		}
		resp, err := http.Post(base+"/v1/route", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		var got struct {
			Replica struct {
				ID string `json:"id"`
			} `json:"replica"`
			Matched  int  `json:"matched_blocks"`
			Degraded bool `json:"degraded"`
		}
		err = json.NewDecoder(resp.Body).Decode(&got)
		resp.Body.Close()
		if err != nil || resp.StatusCode != http.StatusOK || got.Replica.ID != "r0" || got.Matched != 4 || got.Degraded {
			t.Fatalf("decision %d: %d %+v %v; want r0 with 4 matched blocks, not degraded", i, resp.StatusCode, got, err)
		}
	}
	if got := hmgets() - before; got < 9 {
		t.Errorf("the replica ran %d HMGETs for 3 decisions, want the lookups' 9", got)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("serve exit code %d, want 0", code)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("serve did not stop")
	}
}
