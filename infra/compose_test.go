package infra_test

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

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
	env := map[string]map[string]bool{"serve": envNames(t, "serve"), "ingest": envNames(t, "ingest")}
	exposed := dockerfileExposed(t)
	listen := map[string]string{"serve": defaultListen["serve"], "ingest": defaultListen["ingest"]}
	kv := 0
	for name, s := range c.Services {
		if !strings.HasPrefix(s.Image, "kvroute") {
			continue
		}
		kv++
		t.Run(name, func(t *testing.T) {
			if len(s.Command) == 0 || env[s.Command[0]] == nil {
				t.Fatalf("command %q: want serve or ingest", s.Command)
			}
			cmd := s.Command[0]
			for k := range s.Environment {
				if !env[cmd][k] && pendingEnv[k] == "" {
					t.Errorf("sets %s, which kvroute %s does not read", k, cmd)
				}
			}
			_, port, _ := net.SplitHostPort(listen[cmd])
			for _, p := range append(append([]string{}, s.Expose...), s.Ports...) {
				container := p[strings.LastIndex(p, ":")+1:]
				if container != port {
					t.Errorf("port %q: kvroute %s listens on %s", p, cmd, port)
				}
				if n, _ := strconv.Atoi(container); !exposed[int32(n)] {
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
}
