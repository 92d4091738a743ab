package redistest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// ClusterNodeTimeout is the cluster-node-timeout of a test cluster: short,
// so that a stopped primary is declared failed (and its slots CLUSTERDOWN)
// within a test's time, and back soon after it returns.
const ClusterNodeTimeout = 1000 * time.Millisecond

// RedisCluster is a real Redis Cluster of primaries (and, made by
// ClusterWithReplicas, their replicas) started
// for one test on loopback, each node with AOF on in its own data
// directory, stopped when the test ends.
type RedisCluster struct {
	bin     string
	version string
	mu      sync.Mutex
	nodes   []*clusterNode
}

type clusterNode struct {
	port, bus int
	dir       string
	cmd       *exec.Cmd
	exited    chan error
	out       *strings.Builder
}

func (n *clusterNode) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(n.port)) }

// Cluster starts a Redis Cluster of primaries (at least 3, as redis-cli
// --cluster create requires) with every slot assigned, waits until every
// node reports cluster_state:ok, and logs "real Redis Cluster" with its
// version and addresses. Without redis-server or redis-cli the test is
// skipped, or fails when CI is set. The processes it started are killed
// when the test ends, and only those.
//
// The cluster runs with cluster-require-full-coverage no, as a router's
// Redis should: a shard that is down makes only its own slots (models)
// unavailable.
func Cluster(tb testing.TB, primaries int) *RedisCluster {
	tb.Helper()
	return cluster(tb, primaries, 0)
}

// ClusterWithReplicas is Cluster with replicas replicas of each primary:
// Addrs lists the primaries first (redis-cli --cluster create makes
// primaries of the first nodes it is given), then the replicas. It
// returns once every replica has synced with its primary.
func ClusterWithReplicas(tb testing.TB, primaries, replicas int) *RedisCluster {
	tb.Helper()
	c := cluster(tb, primaries, replicas)
	c.waitReplicas(tb, primaries, replicas, 30*time.Second)
	return c
}

func cluster(tb testing.TB, primaries, replicas int) *RedisCluster {
	tb.Helper()
	if primaries < 3 {
		tb.Fatalf("redistest: a cluster needs at least 3 primaries, got %d", primaries)
	}
	bin := lookPath(tb, "redis-server")
	cli := lookPath(tb, "redis-cli")
	c := &RedisCluster{bin: bin}
	tb.Cleanup(c.killAll)
	root := tb.TempDir()
	used := map[int]bool{}
	for i := range primaries * (1 + replicas) {
		n := &clusterNode{dir: filepath.Join(root, "node"+strconv.Itoa(i))}
		if err := os.Mkdir(n.dir, 0o755); err != nil {
			tb.Fatal(err)
		}
		var last error
		// A port found free may be taken before redis-server binds it.
		for range 5 {
			if n.port, n.bus, last = twoFreePorts(used); last != nil {
				continue
			}
			if last = c.start(n); last == nil {
				break
			}
		}
		if last != nil {
			tb.Fatalf("redistest: starting cluster node %d: %v", i, last)
		}
		used[n.port], used[n.bus] = true, true
		c.nodes = append(c.nodes, n)
	}
	args := []string{"--cluster", "create"}
	args = append(args, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	out, err := exec.Command(cli, args...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redistest: redis-cli --cluster create: %v: %s", err, out)
	}
	c.WaitOK(tb, 30*time.Second)
	tb.Logf("real Redis Cluster %s: %d primaries, %d replicas each, at %s", c.version, primaries, replicas, strings.Join(c.Addrs(), ","))
	return c
}

// waitReplicas waits until every node after the first primaries is a
// replica whose link to its primary is up, and every node's CLUSTER SLOTS
// lists replicas replicas for every range.
func (c *RedisCluster) waitReplicas(tb testing.TB, primaries, replicas int, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	for i := primaries; i < len(c.Addrs()); i++ {
		c.WaitSynced(tb, i, time.Until(deadline))
	}
	// CLUSTER SLOTS leaves out a replica until its primary has heard of
	// a replication offset from it (the once-a-second replication ping),
	// and a client finds replicas only there.
	for {
		all, err := c.slotsListReplicas(replicas)
		if all {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: CLUSTER SLOTS does not list every replica after %v: %v", timeout, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// WaitSynced waits until node i is a replica whose link to its primary is
// up (it has loaded the primary's data set): a replica restarted and not
// yet synced answers with an empty data set, and the cluster does not
// promote it when its primary fails.
func (c *RedisCluster) WaitSynced(tb testing.TB, i int, timeout time.Duration) {
	tb.Helper()
	a := c.Addrs()[i]
	deadline := time.Now().Add(timeout)
	for {
		info, err := onNode(a, func(ctx context.Context, rc *redis.Client) *redis.StringCmd { return rc.Info(ctx, "replication") })
		if err == nil && infoField(info, "role") == "slave" && infoField(info, "master_link_status") == "up" {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: cluster node %s is not a synced replica after %v (%v): %s", a, timeout, err, info)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// ReplicasOf is the indexes (into Addrs) of the nodes replicating the
// primary at addr; it fails tb when there is none.
func (c *RedisCluster) ReplicasOf(tb testing.TB, addr string) []int {
	tb.Helper()
	host, port, _ := net.SplitHostPort(addr)
	var out []int
	for i, a := range c.Addrs() {
		info, err := onNode(a, func(ctx context.Context, rc *redis.Client) *redis.StringCmd { return rc.Info(ctx, "replication") })
		if err != nil {
			tb.Fatalf("redistest: %s: info replication: %v", a, err)
		}
		if strings.Contains(info, "master_host:"+host+"\r\nmaster_port:"+port+"\r\n") {
			out = append(out, i)
		}
	}
	if len(out) == 0 {
		tb.Fatalf("redistest: no node replicates %s", addr)
	}
	return out
}

// slotsListReplicas reports whether every node's CLUSTER SLOTS lists
// replicas replicas for every range.
func (c *RedisCluster) slotsListReplicas(replicas int) (bool, error) {
	for _, a := range c.Addrs() {
		slots, err := onNode(a, func(ctx context.Context, rc *redis.Client) *redis.ClusterSlotsCmd { return rc.ClusterSlots(ctx) })
		if err != nil {
			return false, err
		}
		for _, r := range slots {
			if len(r.Nodes) != 1+replicas {
				return false, fmt.Errorf("%s: slots %d-%d list %d nodes", a, r.Start, r.End, len(r.Nodes))
			}
		}
	}
	return true, nil
}

func lookPath(tb testing.TB, name string) string {
	tb.Helper()
	bin, err := exec.LookPath(name)
	if err != nil {
		if os.Getenv("CI") != "" {
			tb.Fatalf("redistest: %s not installed (CI is set): %v", name, err)
		}
		tb.Skipf("redistest: %s not installed", name)
	}
	return bin
}

// twoFreePorts returns a client port and a cluster bus port, distinct from
// each other and from those already used.
func twoFreePorts(used map[int]bool) (int, int, error) {
	var ports []int
	for len(ports) < 2 {
		p, err := stablePort()
		if err != nil {
			return 0, 0, err
		}
		if !used[p] && (len(ports) == 0 || ports[0] != p) {
			ports = append(ports, p)
		}
	}
	return ports[0], ports[1], nil
}

// stablePort returns a free loopback port below the kernel's ephemeral
// range. A node that is stopped and started again must find its ports
// still free (its nodes.conf names them); a port from the ephemeral range
// can meanwhile become the source port of any outgoing connection on the
// machine, which under a busy parallel test run happens. Where the range
// leaves no room below it, it falls back to an ephemeral port.
func stablePort() (int, error) {
	const first = 20000
	lo := ephemeralLow()
	if lo-first < 1000 {
		return freePort()
	}
	for range 100 {
		p := first + rand.IntN(lo-first)
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		_ = l.Close()
		return p, nil
	}
	return freePort()
}

// ephemeralLow returns the lowest port of the kernel's ephemeral range
// (Linux's default, 32768, where the range cannot be read).
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	lo, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return lo
}

// start runs n's redis-server (on its port and data directory: a restart
// reads its nodes.conf and AOF back) and waits until it answers.
func (c *RedisCluster) start(n *clusterNode) error {
	cmd := exec.Command(c.bin,
		"--port", strconv.Itoa(n.port), "--bind", "127.0.0.1", "--protected-mode", "no",
		"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--cluster-port", strconv.Itoa(n.bus),
		"--cluster-node-timeout", strconv.Itoa(int(ClusterNodeTimeout.Milliseconds())),
		"--cluster-require-full-coverage", "no",
		"--appendonly", "yes", "--save", "", "--dir", n.dir,
		// Replicas report their offset soon (ClusterWithReplicas waits
		// for CLUSTER SLOTS to list them).
		"--repl-ping-replica-period", "1")
	n.out = &strings.Builder{}
	cmd.Stdout, cmd.Stderr = n.out, n.out
	if err := cmd.Start(); err != nil {
		return err
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	n.cmd, n.exited = cmd, exited
	rc := redis.NewClient(&redis.Options{Addr: n.addr(), MaxRetries: -1})
	defer rc.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		select {
		case err := <-exited:
			n.cmd = nil
			return fmt.Errorf("redis-server exited: %v: %s", err, n.out.String())
		default:
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		info, err := rc.Info(ctx, "server").Result()
		cancel()
		if err == nil {
			c.version = infoField(info, "redis_version")
			return nil
		}
		if time.Now().After(deadline) {
			n.kill(syscall.SIGKILL)
			return fmt.Errorf("redis-server at %s not ready: %v: %s", n.addr(), err, n.out.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// kill signals n's process, if it runs, and waits for it to exit.
func (n *clusterNode) kill(sig syscall.Signal) {
	if n.cmd == nil {
		return
	}
	_ = n.cmd.Process.Signal(sig)
	<-n.exited
	n.cmd = nil
}

func (c *RedisCluster) killAll() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, n := range c.nodes {
		n.kill(syscall.SIGKILL)
	}
}

// Addrs returns the primaries' host:port addresses: the seeds a client is
// given.
func (c *RedisCluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, n := range c.nodes {
		out[i] = n.addr()
	}
	return out
}

// Stop stops primary i with sig (syscall.SIGTERM: a clean shutdown that
// flushes its AOF; syscall.SIGKILL: a crash, losing up to the last second
// of writes) and waits until it has exited.
func (c *RedisCluster) Stop(tb testing.TB, i int, sig syscall.Signal) {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nodes[i].kill(sig)
	tb.Logf("redistest: cluster node %s stopped (%v)", c.nodes[i].addr(), sig)
}

// Pause freezes primary i with SIGSTOP: its sockets stay open and accept,
// and nothing answers, which is how a hung server (a stalled VM, a disk
// that blocks the AOF) looks to a client. Resume undoes it; a node still
// paused when the test ends is killed like the others.
func (c *RedisCluster) Pause(tb testing.TB, i int) {
	tb.Helper()
	c.signal(tb, i, syscall.SIGSTOP)
	tb.Logf("redistest: cluster node %s paused (SIGSTOP)", c.nodes[i].addr())
}

// Resume continues primary i after Pause.
func (c *RedisCluster) Resume(tb testing.TB, i int) {
	tb.Helper()
	c.signal(tb, i, syscall.SIGCONT)
	tb.Logf("redistest: cluster node %s resumed (SIGCONT)", c.nodes[i].addr())
}

func (c *RedisCluster) signal(tb testing.TB, i int, sig syscall.Signal) {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i]
	if n.cmd == nil {
		tb.Fatalf("redistest: cluster node %s is not running", n.addr())
	}
	if err := n.cmd.Process.Signal(sig); err != nil {
		tb.Fatalf("redistest: cluster node %s: %v: %v", n.addr(), sig, err)
	}
}

// Start starts primary i again on its port and data directory, after Stop:
// it reads its cluster configuration and AOF back and rejoins.
func (c *RedisCluster) Start(tb testing.TB, i int) {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i]
	if n.cmd != nil {
		tb.Fatalf("redistest: cluster node %s already runs", n.addr())
	}
	if err := c.start(n); err != nil {
		tb.Fatalf("redistest: restarting cluster node %s: %v", n.addr(), err)
	}
	tb.Logf("redistest: cluster node %s started again", n.addr())
}

// Wipe deletes stopped primary i's data (its AOF and any RDB file) and
// keeps its cluster configuration, so that Start brings it back as the
// same node serving the same slots, empty: a primary that ran without
// persistence, or lost its disk, restarted.
func (c *RedisCluster) Wipe(tb testing.TB, i int) {
	tb.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[i]
	if n.cmd != nil {
		tb.Fatalf("redistest: cluster node %s runs: stop it before wiping its data", n.addr())
	}
	entries, err := os.ReadDir(n.dir)
	if err != nil {
		tb.Fatalf("redistest: %v", err)
	}
	for _, e := range entries {
		if e.Name() == "nodes.conf" {
			continue
		}
		if err := os.RemoveAll(filepath.Join(n.dir, e.Name())); err != nil {
			tb.Fatalf("redistest: wiping cluster node %s: %v", n.addr(), err)
		}
	}
	tb.Logf("redistest: cluster node %s wiped (its data gone, its slots kept)", n.addr())
}

// Restart stops primary i with sig, leaves it down for down, and starts it
// again (see Stop and Start). It does not wait for the cluster to be ok.
func (c *RedisCluster) Restart(tb testing.TB, i int, sig syscall.Signal, down time.Duration) {
	tb.Helper()
	c.Stop(tb, i, sig)
	time.Sleep(down)
	c.Start(tb, i)
}

// MarkedFailed reports whether another node of the cluster has marked
// node i failed (the FAIL flag, not the PFAIL suspicion): from then on,
// without a replica to promote, its slots answer CLUSTERDOWN. It does not
// fail tb, so that a goroutine scheduling a fault can poll it.
func (c *RedisCluster) MarkedFailed(i int) bool {
	addrs := c.Addrs()
	for j, a := range addrs {
		if j == i {
			continue
		}
		nodes, err := onNode(a, func(ctx context.Context, rc *redis.Client) *redis.StringCmd { return rc.ClusterNodes(ctx) })
		if err != nil {
			continue
		}
		for _, line := range strings.Split(nodes, "\n") {
			f := strings.Fields(line)
			if len(f) > 2 && strings.HasPrefix(f[1], addrs[i]+"@") && slices.Contains(strings.Split(f[2], ","), "fail") {
				return true
			}
		}
	}
	return false
}

// WaitOK waits until every node reports cluster_state:ok and every slot is
// assigned, failing the test after timeout.
func (c *RedisCluster) WaitOK(tb testing.TB, timeout time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(timeout)
	var last string
	for {
		ok := true
		for _, a := range c.Addrs() {
			info, err := onNode(a, func(ctx context.Context, rc *redis.Client) *redis.StringCmd { return rc.ClusterInfo(ctx) })
			if err != nil {
				ok, last = false, a+": "+err.Error()
				break
			}
			if infoField(info, "cluster_state") != "ok" || infoField(info, "cluster_slots_ok") != "16384" {
				ok, last = false, a+": "+strings.ReplaceAll(strings.TrimSpace(info), "\r\n", " ")
				break
			}
		}
		if ok {
			// Every node must also see the same owners, or a client
			// loading its slot map from a node still catching up is
			// redirected (or refused) on its first commands.
			if _, err := c.slotViews(); err != nil {
				ok, last = false, err.Error()
			}
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redistest: cluster not ok after %v: %s", timeout, last)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// slotViews checks that every node's CLUSTER SLOTS names the same primary
// for every range.
func (c *RedisCluster) slotViews() (bool, error) {
	var first string
	for _, a := range c.Addrs() {
		slots, err := onNode(a, func(ctx context.Context, rc *redis.Client) *redis.ClusterSlotsCmd { return rc.ClusterSlots(ctx) })
		if err != nil {
			return false, fmt.Errorf("%s: cluster slots: %w", a, err)
		}
		ranges := make([]string, 0, len(slots))
		for _, r := range slots {
			if len(r.Nodes) == 0 {
				return false, fmt.Errorf("%s: slots %d-%d unowned", a, r.Start, r.End)
			}
			ranges = append(ranges, fmt.Sprintf("%d-%d@%s", r.Start, r.End, r.Nodes[0].Addr))
		}
		sort.Strings(ranges)
		view := strings.Join(ranges, " ")
		if first == "" {
			first = view
		} else if view != first {
			return false, fmt.Errorf("%s sees slots %s, another node %s", a, view, first)
		}
	}
	return true, nil
}

// Primary returns the index (into Addrs) of the primary serving key's slot.
func (c *RedisCluster) Primary(tb testing.TB, key string) int {
	tb.Helper()
	rc := redis.NewClient(&redis.Options{Addr: c.Addrs()[0], MaxRetries: -1})
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	slot, err := rc.ClusterKeySlot(ctx, key).Result()
	if err != nil {
		tb.Fatalf("redistest: cluster keyslot %q: %v", key, err)
	}
	slots, err := rc.ClusterSlots(ctx).Result()
	if err != nil {
		tb.Fatalf("redistest: cluster slots: %v", err)
	}
	for _, r := range slots {
		if int64(r.Start) <= slot && slot <= int64(r.End) && len(r.Nodes) > 0 {
			for i, a := range c.Addrs() {
				if r.Nodes[0].Addr == a {
					return i
				}
			}
		}
	}
	tb.Fatalf("redistest: no primary serves slot %d of %q", slot, key)
	return -1
}

// onNode runs one command on the node at addr over a connection of its
// own, bounded by a second, and returns its result.
func onNode[T any, C interface{ Result() (T, error) }](addr string, cmd func(context.Context, *redis.Client) C) (T, error) {
	rc := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer rc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return cmd(ctx, rc).Result()
}
