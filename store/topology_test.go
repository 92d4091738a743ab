package store_test

import (
	"context"
	"fmt"
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

// roundTrip writes a replica and reads it back through s: the store works
// over whatever it was opened on, scripts included (PutReplica runs one).
func roundTrip(t *testing.T, s *store.Store, id string) {
	t.Helper()
	ctx := context.Background()
	rep := kvroute.Replica{ID: id, Model: "m", URL: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:1"}
	if err := s.PutReplica(ctx, rep); err != nil {
		t.Fatalf("put replica: %v", err)
	}
	got, err := s.GetReplica(ctx, id)
	if err != nil || got.ID != id {
		t.Fatalf("get replica = %+v, %v; want %s", got, err, id)
	}
	if _, err := s.Apply(ctx, "m", id, 0, []kvroute.IndexOp{{Kind: kvroute.OpStore, EngineHash: 1, Key: 7, Parent: kvroute.NoParent}}); err != nil {
		t.Fatalf("apply: %v", err)
	}
}

func open(t *testing.T, c store.Config) (*store.Store, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := store.OpenConfig(ctx, c, store.Options{})
	if err == nil {
		t.Cleanup(func() { s.Close() })
	}
	return s, err
}

// TestTLS opens the store on a real redis-server that speaks only TLS and
// requires client certificates: rediss:// with the CA and the client
// certificate works; without the certificate, or trusting another CA, the
// open fails rather than the first decision.
func TestTLS(t *testing.T) {
	addr, f := redistest.TLSServer(t)
	t.Run("rediss with CA and client certificate", func(t *testing.T) {
		s, err := open(t, store.Config{URL: "rediss://" + addr, TLSCAFile: f.CA, TLSCertFile: f.ClientCert, TLSKeyFile: f.ClientKey})
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, s, "tls")
	})
	t.Run("TLS turned on by its files, not the scheme", func(t *testing.T) {
		s, err := open(t, store.Config{URL: "redis://" + addr, TLSCAFile: f.CA, TLSCertFile: f.ClientCert, TLSKeyFile: f.ClientKey})
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, s, "tls-files")
	})
	for _, tc := range []struct {
		name string
		c    store.Config
		want string // in the error: refused for this reason
	}{
		{"no client certificate", store.Config{URL: "rediss://" + addr, TLSCAFile: f.CA}, "certificate required"},
		{"another CA", store.Config{URL: "rediss://" + addr, TLSCAFile: f.OtherCA, TLSCertFile: f.ClientCert, TLSKeyFile: f.ClientKey}, "unknown authority"},
		{"the wrong server name", store.Config{URL: "rediss://" + addr, TLSCAFile: f.CA, TLSCertFile: f.ClientCert, TLSKeyFile: f.ClientKey, TLSServerName: "redis.example"}, "redis.example"},
		{"plain TCP", store.Config{URL: "redis://" + addr}, ""},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			_, err := open(t, tc.c)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("open = %v, want an error mentioning %q", err, tc.want)
			}
		})
	}
}

// TestACL opens the store as an ACL user on a real redis-server whose
// default user is off, with the password given directly and from a file;
// the file is read again for new connections, so a rotated secret takes
// without a restart. A wrong password fails the open, and its error never
// carries the password.
func TestACL(t *testing.T) {
	const user, pw = "kvroute", "first-secret"
	addr := redistest.ACLServer(t, user, pw)
	ctx := context.Background()
	t.Run("user and password", func(t *testing.T) {
		s, err := open(t, store.Config{URL: "redis://" + addr, Username: user, Password: pw})
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, s, "acl")
	})
	t.Run("in the URL", func(t *testing.T) {
		s, err := open(t, store.Config{URL: "redis://" + user + ":" + pw + "@" + addr})
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, s, "acl-url")
	})
	t.Run("wrong password", func(t *testing.T) {
		_, err := open(t, store.Config{URL: "redis://" + addr, Username: user, Password: "not-it"})
		if err == nil {
			t.Fatal("open succeeded, want an error")
		}
		if strings.Contains(err.Error(), "not-it") {
			t.Errorf("error %q shows the password", err)
		}
	})
	t.Run("password file, rotated", func(t *testing.T) {
		file := filepath.Join(t.TempDir(), "password")
		if err := os.WriteFile(file, []byte(pw+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		s, err := open(t, store.Config{URL: "redis://" + addr, Username: user, PasswordFile: file})
		if err != nil {
			t.Fatal(err)
		}
		roundTrip(t, s, "acl-file")
		// Rotate: the server takes the new password alone, the secret
		// file changes, and every existing connection is cut, as a
		// restart of the server or a proxy would.
		admin := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: pw})
		defer admin.Close()
		const next = "second-secret"
		if err := admin.Do(ctx, "ACL", "SETUSER", user, "resetpass", ">"+next).Err(); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(file, []byte(next+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		// The admin's own connection goes too; it reconnects with the
		// new password only because go-redis retries with its options,
		// so count the kills from a fresh client.
		killer := redis.NewClient(&redis.Options{Addr: addr, Username: user, Password: next})
		defer killer.Close()
		if n, err := killer.Do(ctx, "CLIENT", "KILL", "USER", user, "SKIPME", "yes").Int(); err != nil || n == 0 {
			t.Fatalf("CLIENT KILL USER = %d, %v; want the store's connections cut", n, err)
		}
		wait.UntilNil(t, "the store to work after the rotation", func() error {
			_, err := s.GetReplica(ctx, "acl-file")
			return err
		})
	})
}

// TestSentinel opens the store through a real Sentinel watching a primary
// and its replica, then has the Sentinel fail the primary over: the store
// follows the new primary by itself, and what it wrote before is there.
func TestSentinel(t *testing.T) {
	set := redistest.Sentinels(t)
	s, err := open(t, store.Config{Addrs: []string{set.Sentinel}, MasterName: set.Master})
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(t, s, "before")
	ctx := context.Background()
	// The replica must hold the write before the failover promotes it.
	rc := redis.NewClient(&redis.Options{Addr: set.Replica, MaxRetries: -1})
	defer rc.Close()
	wait.Until(t, "the replica to receive the primary's writes", func() bool {
		n, _ := rc.Exists(ctx, "kvr:replicas").Result()
		return n == 1
	})
	sc := redis.NewSentinelClient(&redis.Options{Addr: set.Sentinel})
	defer sc.Close()
	if err := sc.Failover(ctx, set.Master).Err(); err != nil {
		t.Fatal(err)
	}
	wait.UntilNil(t, "the Sentinel to promote the replica", func() error {
		a, err := sc.GetMasterAddrByName(ctx, set.Master).Result()
		if err == nil && len(a) == 2 && a[0]+":"+a[1] == set.Replica {
			return nil
		}
		return fmt.Errorf("it names %v (%v)", a, err)
	})
	// Until the Sentinel demotes the old primary it still takes writes,
	// which its resync then drops: the store must come to write where the
	// Sentinel points, which only a store that asks the Sentinel does.
	i := 0
	wait.UntilNil(t, "the store to write to the new primary", func() error {
		id := "after-" + strconv.Itoa(i)
		i++
		if err := s.PutReplica(ctx, kvroute.Replica{ID: id, Model: "m", URL: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:1"}); err != nil {
			return err
		}
		if landed, err := rc.HExists(ctx, "kvr:replicas", id).Result(); err != nil || !landed {
			return fmt.Errorf("%s not on the new primary (%v)", id, err)
		}
		return nil
	})
	if _, err := s.GetReplica(ctx, "before"); err != nil {
		t.Errorf("a replica written before the failover: %v", err)
	}
	role, err := rc.Do(ctx, "ROLE").Slice()
	if err != nil || len(role) == 0 || role[0] != "master" {
		t.Errorf("the old replica's role = %v, %v; want master", role, err)
	}
}
