package infra_test

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// stage is one FROM … AS name section of the Dockerfile.
type stage struct {
	From, Name string
	Expose     []int32
	User       string
	Entrypoint []string
	Cmd        []string
}

// dockerfileStages parses the few instructions the checks need; the
// Dockerfile has no line continuations in them.
func dockerfileStages(tb testing.TB) []stage {
	tb.Helper()
	f, err := os.Open(filepath.Join(repoRoot(tb), "Dockerfile"))
	if err != nil {
		tb.Fatal(err)
	}
	defer f.Close()
	var stages []stage
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) == 0 || strings.HasPrefix(fields[0], "#") {
			continue
		}
		rest := strings.TrimSpace(strings.TrimPrefix(sc.Text(), fields[0]))
		switch strings.ToUpper(fields[0]) {
		case "FROM":
			s := stage{From: fields[1]}
			if len(fields) == 4 && strings.EqualFold(fields[2], "AS") {
				s.Name = fields[3]
			}
			stages = append(stages, s)
		case "EXPOSE":
			for _, p := range fields[1:] {
				n, err := strconv.Atoi(strings.TrimSuffix(p, "/tcp"))
				if err != nil {
					tb.Fatalf("Dockerfile: EXPOSE %s: %v", p, err)
				}
				stages[len(stages)-1].Expose = append(stages[len(stages)-1].Expose, int32(n))
			}
		case "USER":
			stages[len(stages)-1].User = rest
		case "ENTRYPOINT", "CMD":
			var v []string
			if err := json.Unmarshal([]byte(rest), &v); err != nil {
				tb.Fatalf("Dockerfile: %s %s: want the exec (JSON) form: %v", fields[0], rest, err)
			}
			if strings.EqualFold(fields[0], "CMD") {
				stages[len(stages)-1].Cmd = v
			} else {
				stages[len(stages)-1].Entrypoint = v
			}
		}
	}
	if err := sc.Err(); err != nil {
		tb.Fatal(err)
	}
	return stages
}

// dockerfileExposed is the set of ports the runtime image EXPOSEs.
func dockerfileExposed(tb testing.TB) map[int32]bool {
	tb.Helper()
	out := map[int32]bool{}
	for _, s := range dockerfileStages(tb) {
		if s.Name == "runtime" {
			for _, p := range s.Expose {
				out[p] = true
			}
		}
	}
	return out
}

// TestDockerfile checks that both runtime targets are the same image: from
// scratch, a numeric non-root user, the binary as entrypoint, serve by
// default, and the two commands' ports exposed; and that the default target
// is the from-source one.
func TestDockerfile(t *testing.T) {
	stages := dockerfileStages(t)
	if len(stages) == 0 {
		t.Fatal("Dockerfile has no FROM")
	}
	if got, want := stages[len(stages)-1].Name, "runtime"; got != want {
		t.Errorf("last stage (the default target) is %q, want %q", got, want)
	}
	for _, name := range []string{"runtime", "runtime-local"} {
		t.Run(name, func(t *testing.T) {
			i := slices.IndexFunc(stages, func(s stage) bool { return s.Name == name })
			if i < 0 {
				t.Fatalf("no stage %q", name)
			}
			s := stages[i]
			if s.From != "scratch" {
				t.Errorf("FROM %s, want scratch", s.From)
			}
			uid, _, _ := strings.Cut(s.User, ":")
			if n, err := strconv.Atoi(uid); err != nil || n == 0 {
				t.Errorf("USER %q, want a numeric non-root UID (runAsNonRoot verifies only numbers)", s.User)
			}
			if got, want := s.Entrypoint, []string{"/kvroute"}; !slices.Equal(got, want) {
				t.Errorf("ENTRYPOINT %q, want %q", got, want)
			}
			if got, want := s.Cmd, []string{"serve"}; !slices.Equal(got, want) {
				t.Errorf("CMD %q, want %q", got, want)
			}
			got := slices.Sorted(slices.Values(s.Expose))
			want := []int32{8080, 9091}
			if !slices.Equal(got, want) {
				t.Errorf("EXPOSE %v, want %v (serve's --listen, ingest's --metrics-listen)", got, want)
			}
			if got, want := strings.TrimPrefix(defaultListen["serve"], ":"), "8080"; got != want {
				t.Errorf("serve's default listen port %s, want %s", got, want)
			}
		})
	}
}
