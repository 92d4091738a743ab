package infra_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestImage builds the runtime-local target from the binary the tests
// built, the way infra/README.md says to on a machine that cannot pull
// base images, and runs `kvroute version` in it. It needs podman (with
// runc, to run it on machines like this project's) or buildah (to build
// only); without them it skips. `make test` installs podman and runc from
// Debian's packages where it can (scripts/ensure-deps.sh).
func TestImage(t *testing.T) {
	builder := ""
	for _, b := range []string{"podman", "buildah"} {
		if _, err := exec.LookPath(b); err == nil {
			builder = b
			break
		}
	}
	if builder == "" {
		t.Skip("neither podman nor buildah is installed (apt-get install podman): the image is not built")
	}
	const caBundle = "/etc/ssl/certs/ca-certificates.crt"
	if _, err := os.Stat(caBundle); err != nil {
		t.Skipf("no CA bundle at %s (apt-get install ca-certificates): %v", caBundle, err)
	}

	ctxDir := t.TempDir()
	root := repoRoot(t)
	copyFile(t, filepath.Join(root, "Dockerfile"), filepath.Join(ctxDir, "Dockerfile"))
	copyFile(t, filepath.Join(root, ".dockerignore"), filepath.Join(ctxDir, ".dockerignore"))
	copyFile(t, kvrouteBinary(t), filepath.Join(ctxDir, "bin", "kvroute"))
	copyFile(t, caBundle, filepath.Join(ctxDir, "bin", "ca-certificates.crt"))
	tag := fmt.Sprintf("localhost/kvroute-infra-test:%d", os.Getpid())

	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	buildArgs := []string{"build", "--target", "runtime-local", "-t", tag, ctxDir}
	if builder == "buildah" {
		buildArgs[0] = "bud"
	}
	if out, err := exec.CommandContext(ctx, builder, buildArgs...).CombinedOutput(); err != nil {
		t.Fatalf("%s %s: %v\n%s", builder, strings.Join(buildArgs, " "), err, out)
	}
	t.Cleanup(func() { _ = exec.Command(builder, "rmi", "-f", tag).Run() })

	t.Run("config", func(t *testing.T) {
		// The whole inspect document, decoded here: Debian's buildah has
		// no json function in its --format templates.
		out, err := exec.CommandContext(ctx, builder, "inspect", "--type", "image", tag).Output()
		if err != nil {
			t.Fatalf("%s inspect: %v", builder, err)
		}
		type config struct {
			User         string
			ExposedPorts map[string]struct{}
			Entrypoint   []string
			Cmd          []string
		}
		var c config
		if builder == "buildah" {
			var doc struct {
				OCIv1 struct {
					Config config `json:"config"`
				}
			}
			err = json.Unmarshal(out, &doc)
			c = doc.OCIv1.Config
		} else {
			var doc []struct{ Config config }
			if err = json.Unmarshal(out, &doc); err == nil && len(doc) != 1 {
				err = fmt.Errorf("%d images, want 1", len(doc))
			}
			if err == nil {
				c = doc[0].Config
			}
		}
		if err != nil {
			t.Fatalf("%s inspect: %v\n%s", builder, err, out)
		}
		if got, want := c.User, "65532:65532"; got != want {
			t.Errorf("User %q, want %q", got, want)
		}
		ports := slices.Sorted(func(yield func(string) bool) {
			for p := range c.ExposedPorts {
				if !yield(p) {
					return
				}
			}
		})
		if got, want := ports, []string{"8080/tcp", "9091/tcp"}; !slices.Equal(got, want) {
			t.Errorf("ExposedPorts %v, want %v", got, want)
		}
		if got, want := c.Entrypoint, []string{"/kvroute"}; !slices.Equal(got, want) {
			t.Errorf("Entrypoint %q, want %q", got, want)
		}
		if got, want := c.Cmd, []string{"serve"}; !slices.Equal(got, want) {
			t.Errorf("Cmd %q, want %q", got, want)
		}
	})

	t.Run("runs", func(t *testing.T) {
		if builder != "podman" {
			t.Skip("buildah builds but does not run images here; install podman to run it")
		}
		out, err := podmanRun(ctx, tag, "version")
		if err != nil {
			t.Skipf("podman cannot run containers on this machine (the image built; its config is checked above): %v\n%s", err, out)
		}
		if got, want := strings.TrimSpace(out), "kvroute "+testVersion; got != want {
			t.Errorf("kvroute version in the image printed %q, want %q", got, want)
		}
	})
}

// podmanRun runs the image without a network. Sandboxes that allow no
// cgroup v2 controllers and cap RLIMIT_NOFILE/NPROC (this project's
// machines) refuse podman's defaults; runc with cgroupfs and explicit
// limits runs there, so that is tried second.
func podmanRun(ctx context.Context, image string, args ...string) (string, error) {
	attempts := [][]string{{"run", "--rm", "--network", "none"}}
	if _, err := exec.LookPath("runc"); err == nil {
		attempts = append(attempts, []string{"--runtime", "runc", "--cgroup-manager", "cgroupfs", "run", "--rm", "--network", "none",
			"--ulimit", "nofile=1024:1024", "--ulimit", "nproc=1024:1024"})
	}
	var out []byte
	var err error
	for _, a := range attempts {
		cmd := exec.CommandContext(ctx, "podman", append(append(a, image), args...)...)
		out, err = cmd.CombinedOutput()
		if err == nil {
			return string(out), nil
		}
	}
	return string(out), err
}

func copyFile(tb testing.TB, from, to string) {
	tb.Helper()
	if err := os.MkdirAll(filepath.Dir(to), 0o755); err != nil {
		tb.Fatal(err)
	}
	in, err := os.Open(from)
	if err != nil {
		tb.Fatal(err)
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		tb.Fatal(err)
	}
	out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, fi.Mode())
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		tb.Fatal(err)
	}
	if err := out.Close(); err != nil {
		tb.Fatal(err)
	}
}
