package infra_test

import (
	"maps"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/app"
	"sigs.k8s.io/yaml"
)

// composeFile mirrors the fields compose.yaml uses, decoded strictly: a
// misspelt key is an error rather than a setting Compose ignores.
type composeFile struct {
	XKvroute map[string]any            `json:"x-kvroute"`
	Services map[string]composeService `json:"services"`
	Volumes  map[string]any            `json:"volumes"`
}

type composeService struct {
	Build *struct {
		Context string `json:"context"`
		Target  string `json:"target"`
	} `json:"build,omitempty"`
	Image       string            `json:"image"`
	Command     []string          `json:"command"`
	Environment map[string]string `json:"environment,omitempty"`
	Ports       []string          `json:"ports,omitempty"`
	Expose      []string          `json:"expose,omitempty"`
	Volumes     []string          `json:"volumes,omitempty"`
	ReadOnly    bool              `json:"read_only,omitempty"`
	User        string            `json:"user,omitempty"`
	CapDrop     []string          `json:"cap_drop,omitempty"`
	SecurityOpt []string          `json:"security_opt,omitempty"`
	Restart     string            `json:"restart,omitempty"`
	Profiles    []string          `json:"profiles,omitempty"`
	DependsOn   any               `json:"depends_on,omitempty"`
	Deploy      *struct {
		Replicas int `json:"replicas"`
	} `json:"deploy,omitempty"`
	Healthcheck *struct {
		Test     []string `json:"test"`
		Interval string   `json:"interval"`
		Timeout  string   `json:"timeout"`
		Retries  int      `json:"retries"`
	} `json:"healthcheck,omitempty"`
}

// TestCompose checks compose.yaml's kvroute services against the binary:
// the environment names each command reads, the ports it listens on (and
// the image EXPOSEs), and the lockdown the manifests also apply.
func TestCompose(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(repoRoot(t), "compose.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		t.Fatalf("compose.yaml: %v", err)
	}
	env := map[string]map[string]bool{"serve": envNames(t, "serve"), "ingest": envNames(t, "ingest"), "sim-replica": envNames(t, "sim-replica")}
	exposed := dockerfileExposed(t)
	sim := simPorts(t)
	// The ports each command listens on by default. The Dockerfile EXPOSEs
	// the production commands' (serve, ingest); a simulated replica's are
	// vLLM's, published on the compose network only.
	ports := map[string]map[string]bool{"sim-replica": {}}
	for _, cmd := range []string{"serve", "ingest"} {
		_, p, _ := net.SplitHostPort(defaultListen[cmd])
		ports[cmd] = map[string]bool{p: true}
	}
	for _, p := range sim {
		ports["sim-replica"][p] = true
	}
	kv := 0
	for name, s := range c.Services {
		if !strings.HasPrefix(s.Image, "kvroute") {
			continue
		}
		kv++
		t.Run(name, func(t *testing.T) {
			if len(s.Command) == 0 || env[s.Command[0]] == nil {
				t.Fatalf("command %q: want serve, ingest or sim-replica", s.Command)
			}
			cmd := s.Command[0]
			for k := range s.Environment {
				if !env[cmd][k] && pendingEnv[k] == "" {
					t.Errorf("sets %s, which kvroute %s does not read", k, cmd)
				}
			}
			for _, p := range append(append([]string{}, s.Expose...), s.Ports...) {
				container := p[strings.LastIndex(p, ":")+1:]
				if !ports[cmd][container] {
					t.Errorf("port %q: kvroute %s listens on %v", p, cmd, slices.Sorted(maps.Keys(ports[cmd])))
				}
				if n, _ := strconv.Atoi(container); cmd != "sim-replica" && !exposed[int32(n)] {
					t.Errorf("port %q is not EXPOSEd by the Dockerfile", p)
				}
			}
			if !s.ReadOnly || s.User == "" || s.User[0] == '0' || len(s.CapDrop) == 0 || s.CapDrop[0] != "ALL" {
				t.Errorf("read_only %v, user %q, cap_drop %v: want the manifests' lockdown", s.ReadOnly, s.User, s.CapDrop)
			}
			if s.Build == nil || s.Build.Target != "runtime-local" && s.Build.Target != "runtime" {
				t.Errorf("build %+v: want a target of the Dockerfile", s.Build)
			}
		})
	}
	if kv < 2 {
		t.Errorf("%d kvroute services, want serve and ingest at least", kv)
	}
	if r := c.Services["ingest"].Deploy; r == nil || r.Replicas < 2 {
		t.Errorf("ingest deploy %+v: want 2+ replicas sharing leases", r)
	}
	t.Run("replicas file", func(t *testing.T) { checkComposeReplicas(t, c, sim) })
}

// checkComposeReplicas checks the replicas file serve registers at start
// against the services: it is mounted where KVROUTE_REPLICAS_FILE says,
// loads as serve loads it, and each replica is a sim-replica service of the
// file, at the ports that command listens on, of the model it serves,
// default profile (so that `docker compose up` routes over them).
func checkComposeReplicas(t *testing.T, c composeFile, sim map[string]string) {
	serve := c.Services["serve"]
	path := serve.Environment["KVROUTE_REPLICAS_FILE"]
	if path == "" {
		t.Fatal("serve sets no KVROUTE_REPLICAS_FILE: the simulated replicas would never be registered")
	}
	host := ""
	for _, v := range serve.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) >= 2 && parts[1] == path {
			host = parts[0]
		}
	}
	if host == "" {
		t.Fatalf("serve mounts nothing at %s (volumes %v)", path, serve.Volumes)
	}
	reps, err := app.LoadReplicasFile(filepath.Join(repoRoot(t), host))
	if err != nil {
		t.Fatal(err)
	}
	if len(reps) == 0 {
		t.Fatal("the replicas file registers no replica")
	}
	for _, r := range reps {
		u, err := url.Parse(r.URL)
		if err != nil {
			t.Fatal(err)
		}
		s, ok := c.Services[u.Hostname()]
		if !ok || len(s.Command) == 0 || s.Command[0] != "sim-replica" || len(s.Profiles) > 0 {
			t.Errorf("replica %s: %s is no sim-replica service of the default profile", r.ID, u.Hostname())
			continue
		}
		if len(s.Command) > 1 {
			t.Errorf("replica %s: service %s passes flags %q; this check reads the defaults only", r.ID, u.Hostname(), s.Command[1:])
		}
		want := map[string]string{
			"url":    "http://" + net.JoinHostPort(u.Hostname(), sim["listen"]),
			"events": "tcp://" + net.JoinHostPort(u.Hostname(), sim["events"]),
			"replay": "tcp://" + net.JoinHostPort(u.Hostname(), sim["replay"]),
			"model":  sim["model"],
		}
		got := map[string]string{"url": r.URL, "events": r.Events, "replay": r.Replay, "model": r.Model}
		for k, w := range want {
			if got[k] != w {
				t.Errorf("replica %s: %s %q, want %q (the service's)", r.ID, k, got[k], w)
			}
		}
	}
}

var helpDefault = regexp.MustCompile(`--(listen|events|replay|model) \S+ +\(env [A-Z_]+, default "([^"]*)"\)`)

// simPorts reads `kvroute sim-replica -h` for the defaults a service that
// passes no flags runs with: the model, and the ports (only) of --listen,
// --events and --replay.
func simPorts(t *testing.T) map[string]string {
	t.Helper()
	out, err := exec.Command(kvrouteBinary(t), "sim-replica", "-h").CombinedOutput()
	if err != nil {
		t.Fatalf("kvroute sim-replica -h: %v\n%s", err, out)
	}
	got := map[string]string{}
	for _, m := range helpDefault.FindAllStringSubmatch(string(out), -1) {
		v := m[2]
		if m[1] != "model" {
			v = v[strings.LastIndex(v, ":")+1:]
		}
		got[m[1]] = v
	}
	if len(got) != 4 {
		t.Fatalf("kvroute sim-replica -h: found defaults %v, want --listen, --events, --replay and --model\n%s", got, out)
	}
	return got
}
