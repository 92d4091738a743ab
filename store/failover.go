package store

import (
	"context"
	"errors"
	"time"

	"github.com/redis/go-redis/v9"
)

// A Cluster client routes by a slot map it caches. go-redis reloads that
// map when a node answers MOVED or READONLY, and otherwise once a minute
// (v9.23's default): a primary that dies never answers at all, so after
// the cluster promoted its replica every command for the dead primary's
// slots still went to it, refused, for up to a minute (found by
// TestClusterReadReplicaFaults; the restart tests bring the same node
// back, which hides it). kvroute's Cluster clients therefore reload the
// map every clusterReload while they are used, and at once (go-redis
// coalesces reloads, 200 ms apart at most) when a command finds a node
// unreachable.

// clusterReload bounds how long a Cluster client routes by a map a
// failover has made wrong: one CLUSTER SLOTS per interval per client (a
// pod with replica reads has two), asked only when there is traffic.
const clusterReload = 2 * time.Second

// newClusterClient builds a Cluster client from co with the reloads above.
func newClusterClient(co *redis.ClusterOptions) *redis.ClusterClient {
	if co.ClusterStateReloadInterval == 0 || co.ClusterStateReloadInterval > clusterReload {
		co.ClusterStateReloadInterval = clusterReload
	}
	cc := redis.NewClusterClient(co)
	cc.AddHook(reloadOnOutage{cc})
	return cc
}

// reloadOnOutage asks for a fresh slot map after a command that could not
// reach its node.
type reloadOnOutage struct{ c *redis.ClusterClient }

func (h reloadOnOutage) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h reloadOnOutage) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		h.check(err)
		return err
	}
}

func (h reloadOnOutage) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		h.check(err)
		return err
	}
}

func (h reloadOnOutage) check(err error) {
	// A caller that gave up says nothing about the cluster; a deadline
	// may (a hung node), and go-redis runs one reload at a time.
	if err != nil && !errors.Is(err, context.Canceled) && unavailable(err) {
		h.c.ReloadState(context.Background())
	}
}
