package tests_test

import (
	"context"
	"math/rand/v2"
	"strconv"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/store"
)

// faultRouter is the router of the store fault tests, over st, as a pod
// runs it: progress reports that meet an outage are queued and retried by
// its own task, which runs until the test ends. Without it a release
// queued during the outage would never land, and its lease would keep
// the holder loaded (no ingestor sweeps there).
func faultRouter(t *testing.T, st *store.Store, seed uint64) *router.Router {
	t.Helper()
	cfg := router.DefaultConfig()
	cfg.BlockSize = bs
	rt, err := router.New(st, st, cfg, router.Options{Rand: rand.New(rand.NewPCG(seed, seed))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { defer close(ran); _ = rt.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-ran })
	return rt
}

// heldPrompt registers two event-fed replicas of model m, m-r0 and m-r1,
// and indexes an 8-block prompt drawn from r on m-r0; a cache-aware
// decision for it goes to m-r0 with 8 matched blocks.
func heldPrompt(t *testing.T, ctx context.Context, st *store.Store, rt *router.Router, m string, r *rand.Rand) []uint32 {
	t.Helper()
	for i := range 2 {
		rep := kvroute.Replica{ID: m + "-r" + strconv.Itoa(i), Model: m, URL: "http://127.0.0.1:1", Events: "tcp://127.0.0.1:1"}
		if err := st.PutReplica(ctx, rep); err != nil {
			t.Fatal(err)
		}
	}
	var p []uint32
	for _, tok := range prompt(r, nil, 8*bs) {
		p = append(p, uint32(tok))
	}
	keys := kvroute.BlockKeys(rt.KeySpace(m, ""), bs, p, nil)
	var ops []kvroute.IndexOp
	parent := kvroute.NoParent
	for _, k := range keys {
		ops = append(ops, kvroute.IndexOp{Kind: kvroute.OpStore, EngineHash: uint64(k) ^ 0x5555, Key: k, Parent: parent})
		parent = k
	}
	if _, err := st.Apply(ctx, m, m+"-r0", 1, ops); err != nil {
		t.Fatalf("apply %s: %v", m, err)
	}
	return p
}
