package store

import (
	"context"

	"github.com/redis/go-redis/v9"
)

// FailureDomain names the part of the store whose failures model's calls
// share, for the router's back-off windows; model "" names the registry's.
// One server, or Sentinel's one primary, is one domain: when it fails
// every call fails. Under Cluster a model's keys all hash to its tag's
// slot, and the domain is the primary that serves the slot now, so that
// the models of a shard that hangs wait out its timeout once a window
// between them, not once each, and a slot that fails over to another
// primary is tried there at once. The cluster client's slot table is
// read, no command is sent: the store's first command loaded it (Open
// pings), and the client refreshes it in the background. Domains are
// bounded by the cluster's primaries.
func (s *Store) FailureDomain(model string) string {
	cc, ok := s.c.(*redis.ClusterClient)
	if !ok {
		return "redis"
	}
	key := keyReplicas
	if model != "" {
		key = loadKey(model)
	}
	node, err := cc.MasterForKey(context.Background(), key)
	if err != nil {
		return "cluster" // no slot table: nothing answers
	}
	return node.Options().Addr
}

// RequestModel is the package's RequestModel: the router finds a progress
// report's model (so its back-off window) from the request id.
func (s *Store) RequestModel(id string) (string, bool) { return RequestModel(id) }
