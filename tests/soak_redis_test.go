package tests_test

import (
	"context"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/wait"
)

// soakRedis is the soak's Redis and the faults it can suffer: one
// redis-server without persistence, or (KVROUTE_SOAK_REDIS=cluster) a
// Redis Cluster of three primaries with a replica each, AOF on.
type soakRedis interface {
	// flags connects a kvroute process to it.
	flags() []string
	// client reads it for the invariants (the admission state).
	client(t *testing.T) redis.UniversalClient
	// kinds names the faults it offers the schedule.
	kinds() []string
	// inject injects fault kind, held while hold more requests end, and
	// returns once it has recovered.
	inject(t *testing.T, r *rand.Rand, kind string, hold func(what string))
}

// startSoakRedis starts the Redis KVROUTE_SOAK_REDIS names: "" or
// "single" for one redis-server, "cluster" for a Cluster with replicas.
func startSoakRedis(t *testing.T) soakRedis {
	t.Helper()
	switch m := os.Getenv("KVROUTE_SOAK_REDIS"); m {
	case "", "single":
		p := startRedisProc(t)
		return &soakSingle{p: p, link: startFaultProxy(t, "127.0.0.1:"+strconv.Itoa(p.port))}
	case "cluster":
		return &soakCluster{c: redistest.ClusterWithReplicas(t, 3, 1)}
	default:
		t.Fatalf("KVROUTE_SOAK_REDIS=%q: want single or cluster", m)
		return nil
	}
}

// soakSingle is one redis-server, frozen or restarted empty, which the
// kvroute processes reach through a fault proxy: their link to it can be
// cut (every connection reset, new ones refused) while Redis runs on.
type soakSingle struct {
	p    *redisProc
	link *faultProxy
}

func (s *soakSingle) flags() []string { return []string{"--redis-url", "redis://" + s.link.addr()} }

func (s *soakSingle) client(t *testing.T) redis.UniversalClient {
	rc := redis.NewClient(&redis.Options{Addr: "127.0.0.1:" + strconv.Itoa(s.p.port)})
	t.Cleanup(func() { rc.Close() })
	return rc
}

func (s *soakSingle) kinds() []string {
	return []string{"redis-sigstop", "redis-restart-empty", "redis-link-reset"}
}

func (s *soakSingle) inject(t *testing.T, _ *rand.Rand, kind string, hold func(string)) {
	switch kind {
	case "redis-sigstop":
		s.p.kill(syscall.SIGSTOP)
		hold("redis frozen")
		s.p.kill(syscall.SIGCONT)
	case "redis-restart-empty":
		s.p.kill(syscall.SIGKILL)
		s.p.start()
	case "redis-link-reset":
		s.link.reset.Store(true)
		s.link.resetAll()
		hold("every kvroute process cut off from redis")
		s.link.reset.Store(false)
	}
}

// soakCluster is a Redis Cluster with a replica per primary. A fault hits
// the primary serving one of the slots kvroute uses (the model's, the
// registry's, the epoch's), drawn at random: frozen and continued (a
// freeze past the node timeout fails it over); killed, and restarted with
// its data once its replica took over; or killed and restarted at once
// with its data wiped, which loses the shard's data when it comes back
// before its replica is promoted.
type soakCluster struct{ c *redistest.RedisCluster }

func (s *soakCluster) flags() []string {
	return []string{"--redis-cluster", "--redis-addrs", strings.Join(s.c.Addrs(), ",")}
}

func (s *soakCluster) client(t *testing.T) redis.UniversalClient {
	rc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: s.c.Addrs()})
	t.Cleanup(func() { rc.Close() })
	return rc
}

func (s *soakCluster) kinds() []string {
	return []string{"primary-sigstop", "primary-sigkill", "primary-restart-empty"}
}

// soakSlotKeys are keys in the slots kvroute uses: the soak model's, and
// the registry's (the epoch is one of its fields), and an ingestor
// lease's.
var soakSlotKeys = []string{"kvr:{m:" + soakModel + "}:load", "kvr:replicas", "kvr:own:ingest:" + soakModel + "-s0"}

func (s *soakCluster) inject(t *testing.T, r *rand.Rand, kind string, hold func(string)) {
	t.Helper()
	key := soakSlotKeys[r.IntN(len(soakSlotKeys))]
	var i int
	wait.Until(t, "a node saying which primary serves "+key, func() bool { i = s.primaryOf(key); return i >= 0 })
	// A replica restarted by an earlier fault may still be loading the
	// primary's data, and the cluster promotes no replica that never
	// synced: the shard would stay down until the primary came back.
	for _, j := range s.c.ReplicasOf(t, s.c.Addrs()[i]) {
		s.c.WaitSynced(t, j, time.Minute)
	}
	switch kind {
	case "primary-sigstop":
		s.c.Pause(t, i)
		hold("a primary frozen")
		s.c.Resume(t, i)
	case "primary-sigkill":
		s.c.Stop(t, i, syscall.SIGKILL)
		hold("a primary killed")
		wait.Until(t, "its replica promoted", func() bool { j := s.primaryOf(key); return j >= 0 && j != i })
		s.c.Start(t, i)
	case "primary-restart-empty":
		s.c.Stop(t, i, syscall.SIGKILL)
		s.c.Wipe(t, i)
		s.c.Start(t, i)
	}
	s.c.WaitOK(t, time.Minute)
}

// primaryOf is the index of the node serving key's slot, asked of any node
// that answers (the one redistest asks may be the one a fault stopped), or
// -1 when none does.
func (s *soakCluster) primaryOf(key string) int {
	addrs := s.c.Addrs()
	for _, a := range addrs {
		rc := redis.NewClient(&redis.Options{Addr: a, MaxRetries: -1})
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		slot, err := rc.ClusterKeySlot(ctx, key).Result()
		var slots []redis.ClusterSlot
		if err == nil {
			slots, err = rc.ClusterSlots(ctx).Result()
		}
		cancel()
		rc.Close()
		if err != nil {
			continue
		}
		for _, sl := range slots {
			if int64(sl.Start) <= slot && slot <= int64(sl.End) && len(sl.Nodes) > 0 {
				for i, b := range addrs {
					if sl.Nodes[0].Addr == b {
						return i
					}
				}
			}
		}
	}
	return -1
}
