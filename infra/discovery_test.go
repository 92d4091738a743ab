package infra_test

import (
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

var flagInHelp = regexp.MustCompile(`(?m)^\s+--([a-z0-9-]+)`)

var (
	flagMu    sync.Mutex
	flagCache = map[string]map[string]bool{}
)

// flagNames is the set of flags `kvroute <command>` takes, as its own -h
// lists them.
func flagNames(tb testing.TB, command string) map[string]bool {
	tb.Helper()
	flagMu.Lock()
	defer flagMu.Unlock()
	if f, ok := flagCache[command]; ok {
		return f
	}
	out, err := exec.Command(kvrouteBinary(tb), command, "-h").CombinedOutput()
	if err != nil {
		tb.Fatalf("kvroute %s -h: %v\n%s", command, err, out)
	}
	names := map[string]bool{}
	for _, m := range flagInHelp.FindAllStringSubmatch(string(out), -1) {
		names[m[1]] = true
	}
	if len(names) == 0 {
		tb.Fatalf("kvroute %s -h lists no --flags; has its help format changed?\n%s", command, out)
	}
	flagCache[command] = names
	return names
}

// pendingFlags are flags the manifests pass ahead of the binary taking
// them, like pendingEnv: logged, not failed, until the binary lists them.
// None now: the discovery flags landed with issue 21.
var pendingFlags = map[string]string{}

// argFlags lists the --flags in a container's args after the command, and
// the value of each (the next arg, or after "=").
func argFlags(args []string) map[string]string {
	out := map[string]string{}
	for i := 1; i < len(args); i++ {
		a, ok := strings.CutPrefix(args[i], "--")
		if !ok {
			continue
		}
		if name, v, ok := strings.Cut(a, "="); ok {
			out[name] = v
			continue
		}
		v := ""
		if i+1 < len(args) && !strings.HasPrefix(args[i+1], "--") {
			v = args[i+1]
			i++
		}
		out[a] = v
	}
	return out
}

func checkArgs(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	for _, w := range o.workloads() {
		for _, c := range w.Template.Spec.Containers {
			cmd, ok := kvrouteContainer(c)
			if !ok {
				continue
			}
			known := flagNames(t, cmd)
			for name := range argFlags(c.Args) {
				switch {
				case known[name]:
				case pendingFlags[name] != "":
					t.Logf("%s %s/%s: --%s is not a flag of kvroute %s yet (pending: %s)", w.Kind, w.Name, c.Name, name, cmd, pendingFlags[name])
				default:
					t.Errorf("%s %s/%s: --%s is no flag of kvroute %s (kvroute %s -h)", w.Kind, w.Name, c.Name, name, cmd, cmd)
				}
			}
		}
	}
}

// argsHave reports whether the named Deployment's first container passes
// any of flags.
func argsHave(o *objects, deploy string, flags ...string) bool {
	d := o.deployment(deploy)
	if d == nil || len(d.Spec.Template.Spec.Containers) == 0 {
		return false
	}
	got := argFlags(d.Spec.Template.Spec.Containers[0].Args)
	return slices.ContainsFunc(flags, func(f string) bool { _, ok := got[strings.TrimPrefix(f, "--")]; return ok })
}

// k8sDiscovery is what an ingestor's args ask of the API server: the
// namespace it reads and the resource it watches there.
func k8sDiscovery(c corev1.Container) (namespace, group, resource string, ok bool) {
	f := argFlags(c.Args)
	if v, ok := f["discover-k8s-service"]; ok {
		ns, _, _ := strings.Cut(v, "/")
		return ns, "discovery.k8s.io", "endpointslices", true
	}
	if v, ok := f["discover-k8s-selector"]; ok {
		ns, _, _ := strings.Cut(v, "/")
		return ns, "", "pods", true
	}
	return "", "", "", false
}

// checkAPIAccess holds the API server's credentials to where discovery
// needs them: a pod that mounts a token runs an ingestor discovering
// through the API server, as a ServiceAccount a RoleBinding grants
// get/list/watch on what it watches, in the namespace its flag names, and
// a NetworkPolicy lets it reach the API server; every Role is read-only.
func checkAPIAccess(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	for _, r := range o.Roles {
		for _, rule := range r.Rules {
			for _, v := range rule.Verbs {
				if !slices.Contains([]string{"get", "list", "watch"}, v) {
					t.Errorf("Role %s: verb %q on %v; discovery only reads (get, list, watch)", r.Name, v, rule.Resources)
				}
			}
		}
	}
	for _, w := range o.workloads() {
		spec := w.Template.Spec
		where := w.Kind + " " + w.Name
		var wants []corev1.Container
		for _, c := range spec.Containers {
			if cmd, ok := kvrouteContainer(c); ok && cmd == "ingest" {
				if _, _, _, ok := k8sDiscovery(c); ok {
					wants = append(wants, c)
				}
			}
		}
		mounts := isTrue(spec.AutomountServiceAccountToken)
		if len(wants) == 0 {
			if mounts {
				t.Errorf("%s: mounts a service-account token but discovers nothing through the API server", where)
			}
			continue
		}
		if !mounts {
			t.Errorf("%s: discovers through the API server without a token (automountServiceAccountToken not true)", where)
		}
		sa := spec.ServiceAccountName
		if sa == "" || sa == "default" {
			t.Errorf("%s: discovers as the namespace's default ServiceAccount; want its own", where)
			continue
		}
		for _, c := range wants {
			ns, group, resource, _ := k8sDiscovery(c)
			if !granted(o, sa, w.namespace(o), ns, group, resource) {
				t.Errorf("%s/%s: ServiceAccount %s is granted no get, list and watch on %s %q in namespace %q (what %v watches)", where, c.Name, sa, group, resource, ns, c.Args)
			}
		}
		if !egressTo(o, w, 443) {
			t.Errorf("%s: discovers through the API server, but no NetworkPolicy allows egress to 443", where)
		}
	}
}

// namespace is where the workload runs: the namespace kustomize set on
// the overlay's objects (every one of them carries the same).
func (w workload) namespace(o *objects) string {
	if d := o.deployment(w.Name); d != nil {
		return d.Namespace
	}
	return ""
}

func granted(o *objects, sa, saNamespace, namespace, group, resource string) bool {
	for _, b := range o.RoleBindings {
		if b.Namespace != namespace || b.RoleRef.Kind != "Role" || b.RoleRef.APIGroup != rbacv1.GroupName {
			continue
		}
		if !slices.ContainsFunc(b.Subjects, func(s rbacv1.Subject) bool {
			return s.Kind == rbacv1.ServiceAccountKind && s.Name == sa && (s.Namespace == saNamespace || s.Namespace == "" && b.Namespace == saNamespace)
		}) {
			continue
		}
		for _, r := range o.Roles {
			if r.Name != b.RoleRef.Name || r.Namespace != b.Namespace {
				continue
			}
			for _, rule := range r.Rules {
				if slices.Contains(rule.APIGroups, group) && slices.Contains(rule.Resources, resource) &&
					slices.Contains(rule.Verbs, "get") && slices.Contains(rule.Verbs, "list") && slices.Contains(rule.Verbs, "watch") {
					return true
				}
			}
		}
	}
	return false
}

func egressTo(o *objects, w workload, port int32) bool {
	for _, np := range o.NetworkPolicies {
		if !selects(&np.Spec.PodSelector, w.Template.Labels) {
			continue
		}
		for _, r := range np.Spec.Egress {
			for _, p := range r.Ports {
				if p.Port != nil && p.Port.IntVal == port {
					return true
				}
			}
		}
	}
	return false
}
