package infra_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"sigs.k8s.io/kustomize/api/krusty"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/kustomize/kyaml/resid"
	"sigs.k8s.io/yaml"
)

// kustomizations lists every directory under k8s/ holding a
// kustomization.yaml, as paths relative to infra/.
func kustomizations(tb testing.TB) []string {
	tb.Helper()
	var dirs []string
	err := filepath.WalkDir("k8s", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Name() == "kustomization.yaml" {
			dirs = append(dirs, filepath.Dir(path))
		}
		return nil
	})
	if err != nil {
		tb.Fatal(err)
	}
	if len(dirs) == 0 {
		tb.Fatal("no kustomization.yaml under infra/k8s")
	}
	return dirs
}

// deployables are the kustomizations one applies: the overlays. The base
// is not one (its Secret and Redis come from an overlay) and components
// only make sense inside one; both are checked through the overlays.
func deployables(tb testing.TB) []string {
	tb.Helper()
	var out []string
	for _, d := range kustomizations(tb) {
		if filepath.Dir(d) == filepath.Join("k8s", "overlays") {
			out = append(out, d)
		}
	}
	return out
}

func readKustomization(tb testing.TB, dir string) types.Kustomization {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(dir, "kustomization.yaml"))
	if err != nil {
		tb.Fatal(err)
	}
	var k types.Kustomization
	if err := yaml.UnmarshalStrict(b, &k); err != nil {
		tb.Fatalf("%s/kustomization.yaml: %v", dir, err)
	}
	return k
}

// build renders a kustomization in process, as `kubectl apply -k` would,
// and decodes the result strictly. Out-of-band objects (*.example.yaml in
// the directory: the Secret production creates by hand) are added, so
// that references to them resolve against their documented shape.
func build(tb testing.TB, dir string) *objects {
	tb.Helper()
	o := render(tb, dir)
	examples, _ := filepath.Glob(filepath.Join(dir, "*.example.yaml"))
	for _, f := range examples {
		b, err := os.ReadFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		if err := o.add(b); err != nil {
			tb.Fatalf("%s: %v", f, err)
		}
	}
	return o
}

// render is kustomize's output alone.
func render(tb testing.TB, dir string) *objects {
	tb.Helper()
	m, err := krusty.MakeKustomizer(krusty.MakeDefaultOptions()).Run(filesys.MakeFsOnDisk(), dir)
	if err != nil {
		tb.Fatalf("kustomize build %s: %v", dir, err)
	}
	y, err := m.AsYaml()
	if err != nil {
		tb.Fatal(err)
	}
	o := &objects{}
	if err := o.add(y); err != nil {
		tb.Fatalf("kustomize build %s: %v", dir, err)
	}
	return o
}

// patchDirective is a strategic-merge directive: on its own line, at the
// top of a patch (an object deleted) or in a list item (an entry deleted).
var patchDirective = regexp.MustCompile(`(?m)^[ \t]*\$patch:.*$`)

// TestKustomizationFiles decodes every file under k8s/ strictly: each
// kustomization into kustomize's own type, each resource and patch into
// its API type; and checks that no YAML file lies there unreferenced
// (a manifest nobody applies is a manifest nobody checks).
func TestKustomizationFiles(t *testing.T) {
	for _, dir := range kustomizations(t) {
		t.Run(dir, func(t *testing.T) {
			k := readKustomization(t, dir)
			used := map[string]bool{"kustomization.yaml": true}
			decodeFile := func(name string, patch bool) {
				t.Helper()
				b, err := os.ReadFile(filepath.Join(dir, name))
				if err != nil {
					t.Errorf("%s: %v", name, err)
					return
				}
				if patch {
					// A strategic-merge directive, not an API field.
					b = patchDirective.ReplaceAll(b, nil)
				}
				if err := (&objects{}).add(b); err != nil {
					t.Errorf("%s: %v", name, err)
				}
			}
			for _, r := range k.Resources {
				fi, err := os.Stat(filepath.Join(dir, r))
				if err != nil {
					t.Errorf("resource %s: %v", r, err)
					continue
				}
				if fi.IsDir() {
					if _, err := os.Stat(filepath.Join(dir, r, "kustomization.yaml")); err != nil {
						t.Errorf("resource %s is a directory without a kustomization.yaml", r)
					}
					continue
				}
				used[r] = true
				decodeFile(r, false)
			}
			for _, c := range k.Components {
				ck := readKustomization(t, filepath.Join(dir, c))
				if got, want := ck.Kind, "Component"; got != want {
					t.Errorf("component %s: kind %q, want %q", c, got, want)
				}
			}
			for _, c := range k.Configurations {
				used[c] = true
				checkConfiguration(t, filepath.Join(dir, c))
			}
			for _, p := range k.Patches {
				if p.Path == "" {
					continue
				}
				used[p.Path] = true
				decodeFile(p.Path, true)
			}
			files, _ := filepath.Glob(filepath.Join(dir, "*.yaml"))
			for _, f := range files {
				name := filepath.Base(f)
				switch {
				case used[name]:
				case strings.HasSuffix(name, ".example.yaml"):
					decodeFile(name, false)
				default:
					t.Errorf("%s is in no resources, patches or configurations list of %s/kustomization.yaml", name, dir)
				}
			}
		})
	}
}

// transformerConfig is the part of kustomize's transformer configuration
// (a kustomization's configurations: files) the manifests use: which
// fields of a kind name an object of another, so that a name prefix or a
// generated name's hash suffix is carried into them. Kustomize's own type
// is internal to it.
type transformerConfig struct {
	NameReference []struct {
		resid.Gvk  `json:",inline"`
		FieldSpecs []types.FieldSpec `json:"fieldSpecs"`
	} `json:"nameReference"`
}

// checkConfiguration decodes a configurations: file strictly and checks
// that it teaches kustomize about kinds these manifests use: a typo in a
// kind would make kustomize skip the field without a word.
func checkConfiguration(tb testing.TB, file string) {
	tb.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		tb.Error(err)
		return
	}
	var c transformerConfig
	if err := yaml.UnmarshalStrict(b, &c); err != nil {
		tb.Errorf("%s: %v", file, err)
		return
	}
	if len(c.NameReference) == 0 {
		tb.Errorf("%s: no nameReference entries", file)
	}
	for _, nr := range c.NameReference {
		if !knownKinds[nr.Kind] {
			tb.Errorf("%s: nameReference kind %q is no kind these manifests use", file, nr.Kind)
		}
		for _, fs := range nr.FieldSpecs {
			if !knownKinds[fs.Kind] || fs.Path == "" {
				tb.Errorf("%s: %s's fieldSpec kind %q path %q: want a kind these manifests use and a path", file, nr.Kind, fs.Kind, fs.Path)
			}
		}
	}
}

// TestOverlays renders the base and every overlay with kustomize and checks
// what must agree across the rendered objects.
func TestOverlays(t *testing.T) {
	env := map[string]map[string]bool{"serve": envNames(t, "serve"), "ingest": envNames(t, "ingest"), "sim-replica": envNames(t, "sim-replica")}
	exposed := dockerfileExposed(t)
	for _, dir := range deployables(t) {
		t.Run(dir, func(t *testing.T) {
			o := build(t, dir)
			for _, c := range checks {
				t.Run(c.name, func(t *testing.T) { c.run(t, o, env, exposed) })
			}
		})
	}
	t.Run("overlays differ only as documented", func(t *testing.T) {
		dev := render(t, filepath.Join("k8s", "overlays", "dev"))
		prod := render(t, filepath.Join("k8s", "overlays", "production"))
		if got := len(dev.StatefulSets); got != 1 {
			t.Errorf("dev: %d StatefulSets, want 1 (in-cluster Redis)", got)
		}
		if got := len(prod.StatefulSets); got != 0 {
			t.Errorf("production: %d StatefulSets, want 0 (managed Redis)", got)
		}
		if got, want := len(dev.HTTPScaled), 1; got != want {
			t.Errorf("dev: %d HTTPScaledObjects, want %d (scale to zero)", got, want)
		}
		if got, want := len(prod.HPAs), 1; got != want {
			t.Errorf("production: %d HPAs, want %d", got, want)
		}
		for _, s := range prod.Secrets {
			t.Errorf("production renders Secret %s: its credentials are made out of band", s.Name)
		}
		for name, o := range map[string]*objects{"dev": dev, "production": prod} {
			if !argsHave(o, "kvroute-ingest", "--discover-k8s-service", "--discover-k8s-selector") {
				t.Errorf("%s: the ingestors discover no Kubernetes fleet", name)
			}
		}
		if dev.deployment("kvroute-sim") == nil {
			t.Errorf("dev: no Deployment kvroute-sim (the simulated replicas it discovers)")
		}
		if prod.deployment("kvroute-sim") != nil {
			t.Errorf("production renders the simulated replicas")
		}
		if got := len(dev.Secrets); got != 1 {
			t.Errorf("dev: %d Secrets, want 1 (generated)", got)
		}
		for name, o := range map[string]*objects{"dev": dev, "production": prod} {
			if got := len(o.Scaled); got != 0 {
				t.Errorf("%s: %d ScaledObjects, want 0 (scale from zero is its own overlay)", name, got)
			}
		}
		zero := render(t, filepath.Join("k8s", "overlays", "dev-scale-from-zero"))
		if got, want := len(zero.Scaled), 1; got != want {
			t.Errorf("dev-scale-from-zero: %d ScaledObjects, want %d (the simulated replicas)", got, want)
		}
		if got, want := len(zero.TriggerAuths), 1; got != want {
			t.Errorf("dev-scale-from-zero: %d TriggerAuthentications, want %d", got, want)
		}
	})
	t.Run("production-cluster reaches Redis as a cluster", func(t *testing.T) {
		o := build(t, filepath.Join("k8s", "overlays", "production-cluster"))
		for _, name := range []string{"kvroute-serve", "kvroute-ingest"} {
			d := o.deployment(name)
			if d == nil {
				t.Fatalf("no Deployment %s", name)
			}
			c := d.Spec.Template.Spec.Containers[0]
			if _, set, _ := envValue(o, c, "KVROUTE_REDIS_URL"); set {
				t.Errorf("%s: KVROUTE_REDIS_URL still set: the seeds replace it", name)
			}
			for k, want := range map[string]string{"KVROUTE_REDIS_ADDRS": "clustercfg.NAME.xxxxxx.REGION.cache.amazonaws.com:6379", "KVROUTE_REDIS_CLUSTER": "true", "KVROUTE_REDIS_TLS": "true"} {
				if got, _, known := envValue(o, c, k); !known || got != want {
					t.Errorf("%s: %s = %q, want %q", name, k, got, want)
				}
			}
			if _, set, _ := envValue(o, c, "KVROUTE_REDIS_PASSWORD"); !set {
				t.Errorf("%s: no KVROUTE_REDIS_PASSWORD (from the Secret)", name)
			}
			_, reads, _ := envValue(o, c, "KVROUTE_REDIS_READ_REPLICAS")
			if want := name == "kvroute-serve"; reads != want {
				t.Errorf("%s: KVROUTE_REDIS_READ_REPLICAS set = %v, want %v (only serve makes lookups)", name, reads, want)
			}
		}
	})
}
