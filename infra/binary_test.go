package infra_test

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sync"
	"testing"
)

// The binary is built once per test run, the way the Dockerfile builds it
// (static, trimmed, version stamped), so that every test here checks the
// product the image ships.
var (
	buildOnce sync.Once
	binPath   string
	buildErr  error
)

const testVersion = "infra-test"

func repoRoot(tb testing.TB) string {
	tb.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		tb.Fatal(err)
	}
	return root
}

func kvrouteBinary(tb testing.TB) string {
	tb.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "kvroute-infra-")
		if err != nil {
			buildErr = err
			return
		}
		binPath = filepath.Join(dir, "kvroute")
		cmd := exec.Command("go", "build", "-trimpath", "-ldflags", "-s -w -X main.version="+testVersion, "-o", binPath, "./cmd/kvroute")
		cmd.Dir = repoRoot(tb)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = &buildError{err: err, out: string(out)}
		}
	})
	if buildErr != nil {
		tb.Fatalf("build kvroute: %v", buildErr)
	}
	return binPath
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + ": " + e.out }

var envInHelp = regexp.MustCompile(`\(env (KVROUTE_[A-Z0-9_]+)`)

// envNames is the set of environment variables `kvroute <command>` reads,
// as its own -h lists them: the manifests are checked against the binary,
// not against a list kept by hand.
func envNames(tb testing.TB, command string) map[string]bool {
	tb.Helper()
	out, err := exec.Command(kvrouteBinary(tb), command, "-h").CombinedOutput()
	if err != nil {
		tb.Fatalf("kvroute %s -h: %v\n%s", command, err, out)
	}
	names := map[string]bool{}
	for _, m := range envInHelp.FindAllStringSubmatch(string(out), -1) {
		names[m[1]] = true
	}
	if len(names) == 0 {
		tb.Fatalf("kvroute %s -h lists no (env KVROUTE_…) names; has its help format changed?\n%s", command, out)
	}
	return names
}

// pendingEnv are names the manifests set ahead of the binary reading them,
// each with who is adding it. Setting an unread variable is harmless (the
// binary ignores it), so a pending name is logged, not failed; once the
// binary reads it the entry is dead and can go.
var pendingEnv = map[string]string{
	"KVROUTE_ADMIN_TOKEN": "serve --admin-token (guards the admin API), being added in cmd/kvroute",
}
