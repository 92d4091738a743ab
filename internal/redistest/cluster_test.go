package redistest_test

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/redis/go-redis/v9"
)

func TestCluster(t *testing.T) {
	c := redistest.Cluster(t, 3)
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	keys := []string{"{a}k", "{b}k", "{c}k", "{d}k", "{e}k"}
	t.Run("every slot served", func(t *testing.T) {
		owners := map[int]bool{}
		for _, k := range keys {
			if err := rc.Set(ctx, k, "v-"+k, 0).Err(); err != nil {
				t.Fatalf("set %s: %v", k, err)
			}
			owners[c.Primary(t, k)] = true
		}
		if got := len(owners); got < 2 {
			t.Errorf("keys landed on %d primaries, want at least 2", got)
		}
	})
	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run("restart "+sig.String(), func(t *testing.T) {
			i := c.Primary(t, keys[0])
			// Under SIGKILL, appendfsync everysec may lose the last
			// second of writes: the ones above are older.
			c.Stop(t, i, sig)
			// Down as a client sees it, not for a time.
			wait.Until(t, "the stopped primary's key unreadable", func() bool { return rc.Get(ctx, keys[0]).Err() != nil })
			c.Start(t, i)
			c.WaitOK(t, 30*time.Second)
			for _, k := range keys {
				// The client finds the node again after its restart.
				wait.UntilNil(t, "get "+k+" after restart", func() error {
					if got, err := rc.Get(ctx, k).Result(); err != nil || got != "v-"+k {
						return fmt.Errorf("got %q, %v; want %q", got, err, "v-"+k)
					}
					return nil
				})
			}
		})
	}
	t.Run("wiped restart comes back empty, serving its slots", func(t *testing.T) {
		i := c.Primary(t, keys[0])
		c.Stop(t, i, syscall.SIGTERM)
		c.Wipe(t, i)
		c.Start(t, i)
		c.WaitOK(t, 30*time.Second)
		for _, k := range keys {
			var err error
			wait.Until(t, "get "+k+" answered after the wiped restart", func() bool {
				err = rc.Get(ctx, k).Err()
				return err == nil || err == redis.Nil
			})
			switch {
			case c.Primary(t, k) == i && err != redis.Nil:
				t.Errorf("get %s on the wiped primary: %v; want nil (no such key)", k, err)
			case c.Primary(t, k) != i && err != nil:
				t.Errorf("get %s on another primary: %v; want its value", k, err)
			}
		}
	})
}
