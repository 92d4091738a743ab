package store_test

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"math"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/internal/syncbuf"
	"github.com/kvroute/kvroute/store"
	"github.com/redis/go-redis/v9"
)

// twoModels returns two model names whose {m:<model>} slots are served by
// different primaries of c.
func twoModels(t *testing.T, c *redistest.RedisCluster) (string, string) {
	t.Helper()
	first, at := "", -1
	for i := range 64 {
		m := "model-" + strconv.Itoa(i)
		p := c.Primary(t, "kvr:{m:"+m+"}:load")
		switch {
		case at < 0:
			first, at = m, p
		case p != at:
			return first, m
		}
	}
	t.Fatal("no two models on different primaries")
	return "", ""
}

// exercise drives every store operation that runs a script or touches a
// model's keys, for one model, and checks the answers: the same workload
// serves the Cluster test (every command must reach its slot's primary)
// and the key audit.
func exercise(t *testing.T, s *store.Store, clk *clock, model string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	rng := rand.New(rand.NewPCG(uint64(len(model)), 7))
	keys := chain(rng, 24)
	must := func(what string, err error) {
		t.Helper()
		if err != nil {
			t.Fatalf("%s %s: %v", model, what, err)
		}
	}
	for _, id := range []string{"a", "b"} {
		must("put replica", s.PutReplica(ctx, kvroute.Replica{ID: model + "-" + id, Model: model, URL: "http://127.0.0.1:1"}))
	}
	// applyfast.lua (fresh chains), apply.lua (a removal), ApplyRun.
	res, err := s.Apply(ctx, model, "a", 1, storeChain(keys, 0, 20, kvroute.TierGPU))
	must("apply a", err)
	if !res.Applied || res.Stored != 20 {
		t.Errorf("%s apply a = %+v, want 20 stored", model, res)
	}
	_, err = s.Apply(ctx, model, "a", 2, []kvroute.IndexOp{remove1(keys[5], kvroute.TierGPU)})
	must("remove", err)
	run := append(storeChain(keys, 0, 12, kvroute.TierGPU), storeChain(keys, 12, 24, kvroute.TierHost)...)
	_, err = s.ApplyRun(ctx, model, "b", "", 1, 2, run)
	must("apply run b", err)
	must("record approx", s.RecordApprox(ctx, model, "c", keys[:8]))
	ov, _, err := s.Lookup(ctx, model, keys, []string{"a", "b", "c"})
	must("lookup", err)
	want := []kvroute.Overlap{{GPU: 5, Any: 5}, {GPU: 12, Any: 24}, {Approx: 8}}
	for i := range want {
		if ov[i] != want[i] {
			t.Errorf("%s lookup[%d] = %+v, want %+v", model, i, ov[i], want[i])
		}
	}
	got, found, err := s.EngineKeys(ctx, model, "a", []uint64{ehOf(keys[3]), ehOf(keys[5])})
	must("engine keys", err)
	if !found[0] || got[0] != keys[3] || found[1] {
		t.Errorf("%s engine keys = %v %v, want %v found, then not found", model, got, found, keys[3])
	}
	if st, err := s.Stats(ctx, model, "a"); err != nil || st.AppliedSeq != 2 || st.Blocks != 19 {
		t.Errorf("%s stats = %+v, %v; want seq 2, 19 blocks", model, st, err)
	}

	// Leases: reserve.lua, advance.lua, release.lua, sweep.lua,
	// reservebest.lua.
	exp := clk.Now().Add(time.Minute)
	l := kvroute.Lease{RequestID: store.RequestID(model, "r1"), Model: model, Replica: "a", PrefillBlocks: 4, DecodeBlocks: 2, Expires: exp}
	if booked, _, err := s.Reserve(ctx, l, 0); err != nil || !booked {
		t.Fatalf("%s reserve = %v, %v; want booked", model, booked, err)
	}
	if ok, err := s.Advance(ctx, l.RequestID); err != nil || !ok {
		t.Errorf("%s advance = %v, %v; want true", model, ok, err)
	}
	if ok, err := s.Release(ctx, l.RequestID); err != nil || !ok {
		t.Errorf("%s release = %v, %v; want true", model, ok, err)
	}
	l2 := l
	l2.RequestID, l2.Expires = store.NewRequestID(model), clk.Now().Add(time.Second)
	if booked, _, err := s.Reserve(ctx, l2, -1); err != nil || !booked {
		t.Fatalf("%s reserve 2 = %v, %v", model, booked, err)
	}
	l3 := l
	l3.RequestID, l3.Replica = store.RequestID(model, "r3"), "b"
	if booked, _, err := s.Reserve(ctx, l3, -1); err != nil || !booked {
		t.Fatalf("%s reserve 3 = %v, %v", model, booked, err)
	}
	clk.Add(2 * time.Second)
	if n, err := s.SweepExpired(ctx, model); err != nil || n != 1 {
		t.Errorf("%s sweep = %d, %v; want 1", model, n, err)
	}
	if loads, err := s.Loads(ctx, model, []string{"a", "b"}); err != nil || loads[0].Requests != 0 || loads[1].Requests != 1 {
		t.Errorf("%s loads after sweep = %+v, %v; want 0 and 1 requests", model, loads, err)
	}
	// reservebest.lua: b owes a request, a nothing; a is cheaper.
	l4 := kvroute.Lease{RequestID: store.RequestID(model, "r4"), Model: model, DecodeBlocks: 2, Expires: exp}
	j, loads, err := s.ReserveBest(ctx, l4, []kvroute.Choice{{Replica: "b", PrefillBlocks: 4}, {Replica: "a", PrefillBlocks: 4}},
		kvroute.ChoiceCost{PrefillScale: 1, RequestWeight: 1, Blocks: 4, Active: 2, Bound: math.Inf(1), Eps: 1e-9})
	if err != nil || j != 1 || len(loads) != 2 || loads[1].Requests != 1 {
		t.Errorf("%s reserve best = %d %+v, %v; want a (1) booked", model, j, loads, err)
	}
	if ok, err := s.Release(ctx, l4.RequestID); err != nil || !ok {
		t.Errorf("%s release best = %v, %v; want true", model, ok, err)
	}
	must("set scraped", s.SetScraped(ctx, model, "a", 1, 2, 0.5))

	// sweepapprox.lua, reset.lua, slot.lua (a's slot was cached: a
	// reset drops it), purge.lua.
	clk.Add(store.DefaultApproxTTL + 2*time.Minute)
	if n, err := s.SweepApprox(ctx, model); err != nil || n != 8 {
		t.Errorf("%s sweep approx = %d, %v; want 8", model, n, err)
	}
	must("reset", s.ResetReplica(ctx, model, "a", ""))
	if _, ok, err := s.AppliedSeq(ctx, model, "a"); err != nil || ok {
		t.Errorf("%s applied seq after reset = %v, %v; want none", model, ok, err)
	}
	_, err = s.Apply(ctx, model, "a", 1, storeChain(keys, 0, 4, kvroute.TierGPU))
	must("apply after reset", err)
	must("purge", s.PurgeReplica(ctx, model, "b"))
	if loads, err := s.Loads(ctx, model, []string{"b"}); err != nil || loads[0] != (kvroute.Load{}) {
		t.Errorf("%s load after purge = %+v, %v; want zero", model, loads, err)
	}
	ov, _, err = s.Lookup(ctx, model, keys, []string{"a", "b"})
	must("lookup after purge", err)
	if want := []kvroute.Overlap{{GPU: 4, Any: 4}, {}}; ov[0] != want[0] || ov[1] != want[1] {
		t.Errorf("%s lookup after purge = %+v, want %+v", model, ov, want)
	}

	// The global keys: registry (MULTI and WATCH on one key), ownership.
	must("set health", s.SetHealth(ctx, model+"-a", kvroute.HealthHealthy, clk.Now()))
	if ok, err := s.Acquire(ctx, "replica/"+model, "me", time.Minute); err != nil || !ok {
		t.Errorf("%s acquire = %v, %v", model, ok, err)
	}
	must("release ownership", s.ReleaseOwnership(ctx, "replica/"+model, "me"))
	must("delete replica", s.DeleteReplica(ctx, model+"-b"))
}

func TestClusterStore(t *testing.T) {
	c := redistest.Cluster(t, 3)
	m1, m2 := twoModels(t, c)
	clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	cfg := store.Config{Addrs: c.Addrs()}
	if got := cfg.Topology(); got != "cluster" {
		t.Fatalf("topology = %q, want cluster", got)
	}
	s, err := store.OpenConfig(context.Background(), cfg, store.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	for _, m := range []string{m1, m2} {
		t.Run(m, func(t *testing.T) { exercise(t, s, clk, m) })
	}
	t.Run("registry", func(t *testing.T) {
		reps, err := s.ListReplicas(context.Background())
		if err != nil || len(reps) != 2 {
			t.Fatalf("replicas = %+v, %v; want the two -a replicas", reps, err)
		}
	})
	t.Run("failure domains are the primaries", func(t *testing.T) {
		byPrimary := map[int]string{}
		for i := range 48 {
			m := "domain-model-" + strconv.Itoa(i)
			p := c.Primary(t, "kvr:{m:"+m+"}:load")
			if got, want := s.FailureDomain(m), c.Addrs()[p]; got != want {
				t.Fatalf("FailureDomain(%q) = %q, want %q, the primary serving its slot", m, got, want)
			}
			byPrimary[p] = m
		}
		if len(byPrimary) != 3 {
			t.Errorf("48 models fell on %d primaries, want all 3", len(byPrimary))
		}
		if got, want := s.FailureDomain(""), c.Addrs()[c.Primary(t, "kvr:replicas")]; got != want {
			t.Errorf("the registry's domain = %q, want %q, the primary serving kvr:replicas", got, want)
		}
	})
	t.Run("old request ids", func(t *testing.T) {
		ctx := context.Background()
		if ok, err := s.Release(ctx, "0123456789abcdef0123456789abcdef"); err != nil || ok {
			t.Errorf("release of an id without a model = %v, %v; want false, nil", ok, err)
		}
		l := kvroute.Lease{RequestID: store.RequestID(m2, "x"), Model: m1, Replica: "a", Expires: time.Now()}
		var fe *kvroute.FieldError
		if _, _, err := s.Reserve(ctx, l, -1); !errors.As(err, &fe) {
			t.Errorf("reserve with another model's id = %v, want a field error", err)
		}
	})
}

// TestScriptKeys audits, on a real redis-server through MONITOR, every
// command every script runs: each key must carry the hash tag of the
// script's declared keys (one Cluster slot), and be one of them, except
// the children sets P k:<key> that a tree walk finds (built from the
// declared blk key, never from an argument).
func TestScriptKeys(t *testing.T) {
	url := redistest.Server(t)
	clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
	s, err := store.Open(context.Background(), url, store.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	o, _ := redis.ParseURL(url)
	ctx := context.Background()
	// MONITOR over a plain connection: every command, with its source.
	conn, err := net.Dial("tcp", o.Addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	rd := bufio.NewReaderSize(conn, 1<<20)
	if ok, err := rd.ReadString('\n'); err != nil || ok != "+OK\r\n" {
		t.Fatalf("monitor = %q, %v", ok, err)
	}
	var lines []string
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				return
			}
			l = strings.TrimSuffix(strings.TrimPrefix(l, "+"), "\r\n")
			if strings.Contains(l, `"end-of-audit"`) {
				return
			}
			lines = append(lines, l)
		}
	}()
	// A fan-out (children beyond the first) and a removal inside it make
	// the scripts walk P k:<key> sets.
	keys := chain(rand.New(rand.NewPCG(3, 3)), 6)
	other := chain(rand.New(rand.NewPCG(4, 4)), 2)
	ops := append(storeChain(keys, 0, 6, kvroute.TierGPU),
		store1(other[0], keys[1], kvroute.TierGPU), store1(other[1], keys[1], kvroute.TierGPU))
	if _, err := s.Apply(ctx, mdl, "f", 1, ops); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Apply(ctx, mdl, "f", 2, []kvroute.IndexOp{remove1(other[0], kvroute.TierGPU), remove1(keys[1], kvroute.TierGPU)}); err != nil {
		t.Fatal(err)
	}
	exercise(t, s, clk, mdl)
	keysOf := redis.NewClient(o)
	defer keysOf.Close()
	if err := keysOf.Echo(ctx, "end-of-audit").Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("MONITOR did not show the end of the workload")
	}

	var declared []string
	scripts, cmds, kids := 0, 0, 0
	for _, line := range lines {
		from, args := monitorLine(t, line)
		if len(args) == 0 {
			continue
		}
		name := strings.ToUpper(args[0])
		if from != "lua" {
			if name == "EVALSHA" || name == "EVAL" {
				n, _ := strconv.Atoi(args[2])
				declared = args[3 : 3+n]
				scripts++
			}
			continue
		}
		if name == "TIME" {
			continue // touches no key (lib.lua's bumpSlots)
		}
		cmds++
		call := make([]any, 0, len(args)+2)
		call = append(call, "command", "getkeys")
		for _, a := range args {
			call = append(call, a)
		}
		ks, err := keysOf.Do(context.Background(), call...).StringSlice()
		if err != nil {
			t.Fatalf("command getkeys %q: %v", args, err)
		}
		tag := hashTag(declared[0])
		for _, k := range ks {
			if hashTag(k) != tag {
				t.Errorf("script with keys %q ran %s on %q: another slot", declared, name, k)
			}
			if !contains(declared, k) {
				if p := strings.TrimSuffix(declared[0], "blk"); p == declared[0] || !strings.HasPrefix(k, p+"k:") {
					t.Errorf("script with keys %q ran %s on %q: not declared", declared, name, k)
				} else {
					kids++
				}
			}
		}
	}
	if scripts < 15 || cmds < 50 || kids == 0 {
		t.Errorf("audited %d script calls, %d commands, %d children-set accesses; want a workload that runs every script and walks children", scripts, cmds, kids)
	}
	t.Logf("audited %d script calls, %d commands inside them (%d on children sets)", scripts, cmds, kids)
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// hashTag is the part of key Redis Cluster hashes: the text between the
// first '{' and the next '}' when not empty, else the whole key.
func hashTag(key string) string {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			return key[i+1 : i+1+j]
		}
	}
	return key
}

// monitorLine parses a MONITOR line, `<time> [<db> <source>] "arg" ...`,
// into its source ("lua" for commands a script ran) and its arguments,
// unescaped.
func monitorLine(t *testing.T, line string) (string, []string) {
	t.Helper()
	open, end := strings.IndexByte(line, '['), strings.IndexByte(line, ']')
	if open < 0 || end < open {
		return "", nil
	}
	src := strings.Fields(line[open+1 : end])
	from := ""
	if len(src) == 2 {
		from = src[1]
	}
	var args []string
	rest := line[end+1:]
	for {
		i := strings.IndexByte(rest, '"')
		if i < 0 {
			break
		}
		var b strings.Builder
		j := i + 1
		for ; j < len(rest) && rest[j] != '"'; j++ {
			if rest[j] != '\\' || j+1 >= len(rest) {
				b.WriteByte(rest[j])
				continue
			}
			j++
			switch rest[j] {
			case 'n':
				b.WriteByte('\n')
			case 'r':
				b.WriteByte('\r')
			case 't':
				b.WriteByte('\t')
			case 'a':
				b.WriteByte('\a')
			case 'b':
				b.WriteByte('\b')
			case 'x':
				v, err := strconv.ParseUint(rest[j+1:j+3], 16, 8)
				if err != nil {
					t.Fatalf("monitor line %q: %v", line, err)
				}
				b.WriteByte(byte(v))
				j += 2
			default:
				b.WriteByte(rest[j])
			}
		}
		args = append(args, b.String())
		rest = rest[j+1:]
	}
	return from, args
}

// TestClusterURL: go-redis's own cluster URL, the seeds as addr options
// (redis://host:port?addr=host2:port2&addr=host3:port3), opens a Cluster
// store, as the same seeds in Addrs do; what serve opens from --redis-url.
func TestClusterURL(t *testing.T) {
	c := redistest.Cluster(t, 3)
	a := c.Addrs()
	cfg := store.Config{URL: "redis://" + a[0] + "?addr=" + a[1] + "&addr=" + a[2] + "&dial_timeout=1s"}
	if got := cfg.Topology(); got != "cluster" {
		t.Fatalf("topology = %q, want cluster", got)
	}
	if got, want := cfg.String(), "cluster "+strings.Join(a, ","); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	s, err := store.OpenConfig(context.Background(), cfg, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	t.Run("every primary is a failure domain", func(t *testing.T) {
		seen := map[string]bool{}
		for i := range 48 {
			seen[s.FailureDomain("url-model-"+strconv.Itoa(i))] = true
		}
		for _, addr := range a {
			if !seen[addr] {
				t.Errorf("no model's domain is %s; domains %v", addr, seen)
			}
		}
	})
	t.Run("round trip", func(t *testing.T) { roundTrip(t, s, "url-replica") })
	t.Run("seeds given twice are refused", func(t *testing.T) {
		twice := cfg
		twice.Addrs = a
		if _, err := store.NewClient(twice); err == nil || !strings.Contains(err.Error(), "give them one way") {
			t.Errorf("NewClient with addr= and Addrs = %v, want an error saying to give the seeds one way", err)
		}
	})
}

// TestClusterNodeURL: a single server's URL that names one node of a
// Cluster (finding 3 of issue 23: every call for another node's slots
// failed on MOVED while the pod reported the store up) opens the Cluster
// from that node, with a warning naming the flags that say so, and every
// model's keys are served, whichever node holds their slot.
func TestClusterNodeURL(t *testing.T) {
	c := redistest.Cluster(t, 3)
	m1, m2 := twoModels(t, c)
	var logs syncbuf.Buffer
	for i, addr := range c.Addrs() {
		t.Run("node "+strconv.Itoa(i), func(t *testing.T) {
			cfg := store.Config{URL: "redis://" + addr}
			if got := cfg.Topology(); got != "single" {
				t.Fatalf("topology = %q, want single: the URL names one server", got)
			}
			clk := &clock{t: time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)}
			s, err := store.OpenConfig(context.Background(), cfg, store.Options{Now: clk.Now, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			for _, m := range []string{m1, m2} {
				id := m + "-node" + strconv.Itoa(i)
				if err := s.PutReplica(context.Background(), kvroute.Replica{ID: id, Model: m, URL: "http://127.0.0.1:1"}); err != nil {
					t.Fatalf("put replica of %s: %v", m, err)
				}
				if _, err := s.Loads(context.Background(), m, []string{id}); err != nil {
					t.Errorf("loads of %s (slot on primary %d): %v", m, c.Primary(t, "kvr:{m:"+m+"}:load"), err)
				}
			}
		})
	}
	if got := logs.String(); !strings.Contains(got, "node of a Redis Cluster") || !strings.Contains(got, "--redis-addrs") {
		t.Errorf("log = %q, want a warning that names --redis-addrs", got)
	}
}
