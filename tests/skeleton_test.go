package tests_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/redis/go-redis/v9"
)

// The skeleton is BenchmarkLoad's reference for the pod-side cost of a
// decision: the HTTP and Redis work any router that keeps its index in
// Redis pays, with none of kvroute's logic. It decodes and keys the body
// exactly as the floor does, makes the two round trips a kvroute decision
// makes (one pipeline reading index fields and the fleet's loads, one
// script booking the pick) and answers a JSON body of the same shape. It
// coalesces nothing and logs nothing, so it is not a lower bound on what a
// router could spend; it says how much of a pod's CPU per decision is the
// machine's HTTP and loopback-Redis cost, which no change inside kvroute's
// decision code can remove.
//
// It runs in this test binary, re-executed with KVROUTE_SKELETON_LISTEN
// set (TestMain), so that it is a process of its own, as the pods are.
const (
	envSkeletonListen = "KVROUTE_SKELETON_LISTEN"
	envSkeletonRedis  = "KVROUTE_SKELETON_REDIS"
	envSkeletonReps   = "KVROUTE_SKELETON_REPLICAS"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(envSkeletonListen); addr != "" {
		n, _ := strconv.Atoi(os.Getenv(envSkeletonReps))
		if err := runSkeleton(addr, os.Getenv(envSkeletonRedis), max(n, 1)); err != nil {
			log.Fatal(err)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// skeletonBook is the booking's stand-in: one load field raised, one lease
// filed (members reused, so the set stays bounded).
var skeletonBook = redis.NewScript(`
redis.call('HINCRBY', KEYS[1], ARGV[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
return 1
`)

func runSkeleton(addr, redisURL string, nRep int) error {
	opt, err := redis.ParseURL(redisURL)
	if err != nil {
		return err
	}
	rc := redis.NewClient(opt)
	ctx := context.Background()
	const loads, leases, index = "skel:{m:bench}:loads", "skel:{m:bench}:leases", "skel:{m:bench}:index"
	fields := make([]any, 0, 4*nRep)
	for i := range nRep {
		fields = append(fields, fmt.Sprintf("r%03d:p", i), 0, fmt.Sprintf("r%03d:d", i), 0)
	}
	if err := rc.HSet(ctx, loads, fields...).Err(); err != nil {
		return err
	}
	var seq atomic.Uint64
	h := http.NewServeMux()
	h.HandleFunc("POST /v1/route", func(w http.ResponseWriter, r *http.Request) {
		raw, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<20))
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		req, err := api.DecodeRouteRequest(raw)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		keys := kvroute.BlockKeys(kvroute.KeySpace{Model: req.Model}, kvroute.DefaultBlockSize, req.TokenIDs, nil)
		// Index fields at every 16th block, as lookup hints are filed.
		probe := make([]string, 0, len(keys)/16+1)
		for i := 15; i < len(keys); i += 16 {
			probe = append(probe, strconv.FormatUint(uint64(keys[i]), 36))
		}
		ctx, cancel := context.WithTimeout(r.Context(), time.Second)
		defer cancel()
		_, err = rc.Pipelined(ctx, func(p redis.Pipeliner) error {
			p.HMGet(ctx, index, probe...)
			p.HGetAll(ctx, loads)
			return nil
		})
		if err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		n := seq.Add(1)
		id := fmt.Sprintf("skel-%d", n)
		pick := fmt.Sprintf("r%03d", n%uint64(nRep))
		if err := skeletonBook.Run(ctx, rc, []string{loads, leases}, pick+":d", 1, time.Now().Unix(), n%4096).Err(); err != nil {
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
			return
		}
		resp := api.RouteResponse{RequestID: id, Replica: api.ReplicaRef{ID: pick, URL: "http://127.0.0.1:1"},
			MatchedBlocks: len(keys), PromptBlocks: len(keys), BlockSize: kvroute.DefaultBlockSize, Policy: "kv",
			ExpiresAt: time.Now().Add(time.Minute), Tokenization: "given", PromptTokens: len(req.TokenIDs)}
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set(api.HeaderRequestID, id)
		w.Header().Set(api.HeaderReplica, pick)
		_ = json.NewEncoder(w).Encode(resp)
	})
	h.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok\n") })
	return http.ListenAndServe(addr, h)
}

// startSkeletons runs n skeleton processes against url, as startPods runs
// kvroute's.
func startSkeletons(tb testing.TB, url string, nRep, n int) []*loadPod {
	tb.Helper()
	bin, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	return startProcs(tb, n, func(addr string) *exec.Cmd {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), envSkeletonListen+"="+addr, envSkeletonRedis+"="+url, envSkeletonReps+"="+strconv.Itoa(nRep))
		return cmd
	})
}
