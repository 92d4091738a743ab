package infra_test

import (
	"net"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// KEDA's operator, which runs the scalers (it dials Redis itself; the
// metrics API server asks the operator), as KEDA's Helm chart and release
// manifests label it.
const kedaNamespace = "keda"

var kedaOperatorLabels = map[string]string{"app": "keda-operator"}

// depthList is the store's per-model queue-depth list (store.depthKey):
// one element per queued request, so its LLEN is the queue's depth.
var depthList = regexp.MustCompile(`^kvr:\{m:([^{}]+)\}:depth$`)

// checkScaledObjects checks what makes a KEDA ScaledObject scale a model
// from zero on kvroute's queue: zero as its floor, a cooldown, a redis
// trigger on the model's depth list that KEDA can authenticate to and
// reach, and a kvroute serve that holds the model's requests while the
// first replica starts. Who else scales the target is checkAutoscalers'.
func checkScaledObjects(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	for _, so := range o.Scaled {
		by := "ScaledObject " + so.Name
		ref := so.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" {
			t.Errorf("%s: targets %s %s, want apps/v1 Deployment", by, ref.APIVersion, ref.Kind)
		}
		if m := so.Spec.MinReplicaCount; m == nil || *m != 0 {
			t.Errorf("%s: minReplicaCount %s, want 0 (scale from zero)", by, orUnset(m))
		}
		if m := so.Spec.MaxReplicaCount; m == nil || *m < 1 {
			t.Errorf("%s: maxReplicaCount %s, want at least 1", by, orUnset(m))
		}
		if c := so.Spec.CooldownPeriod; c == nil || *c <= 0 {
			t.Errorf("%s: cooldownPeriod %s, want it set above 0: KEDA's default (300 s) drops the last replica of a model idle for five minutes", by, orUnset(c))
		}
		n := 0
		for i, tr := range so.Spec.Triggers {
			if tr.Type != "redis" && tr.Type != "redis-cluster" {
				continue
			}
			n++
			checkRedisTrigger(t, o, by+" trigger "+strconv.Itoa(i), so.Namespace, tr)
		}
		if n == 0 {
			t.Errorf("%s: no redis (or redis-cluster) trigger on kvroute's queue depth", by)
		}
	}
}

func orUnset(p *int32) string {
	if p == nil {
		return "unset"
	}
	return strconv.Itoa(int(*p))
}

func checkRedisTrigger(t *testing.T, o *objects, where, namespace string, tr scaleTrigger) {
	md := tr.Metadata
	m := depthList.FindStringSubmatch(md["listName"])
	if m == nil {
		t.Errorf("%s: listName %q, want kvroute's kvr:{m:MODEL}:depth", where, md["listName"])
	} else {
		checkServeHolds(t, o, where, m[1])
	}
	if v, err := strconv.Atoi(md["listLength"]); err != nil || v < 1 {
		t.Errorf("%s: listLength %q, want a positive integer (queued requests per replica)", where, md["listLength"])
	}
	if v, ok := md["activationListLength"]; ok {
		if n, err := strconv.Atoi(v); err != nil || n != 0 {
			t.Errorf("%s: activationListLength %q, want 0: one held request must wake the Deployment", where, v)
		}
	}
	if v, ok := md["enableTLS"]; ok && v != "true" && v != "false" {
		t.Errorf("%s: enableTLS %q, want \"true\" or \"false\"", where, v)
	}
	checkTriggerAuth(t, o, where, tr)
	addrs := []string{md["address"]}
	if tr.Type == "redis-cluster" {
		addrs = strings.Split(md["addresses"], ",")
	}
	for _, a := range addrs {
		host, port, err := net.SplitHostPort(strings.TrimSpace(a))
		if err != nil {
			t.Errorf("%s: address %q is no host:port", where, a)
			continue
		}
		checkKEDAReaches(t, o, where, namespace, host, port)
	}
}

// checkServeHolds checks that kvroute serve declares model, so that a
// request for it with no replica up waits (--cold-start) for the replica
// KEDA starts instead of a 503: the queue the trigger reads fills only
// with held requests.
func checkServeHolds(t *testing.T, o *objects, where, model string) {
	served := false
	for _, w := range o.workloads() {
		for _, c := range w.Template.Spec.Containers {
			if cmd, ok := kvrouteContainer(c); !ok || cmd != "serve" {
				continue
			}
			served = true
			var decl []string
			if v, set, _ := envValue(o, c, "KVROUTE_MODEL_LIMITS"); set {
				decl = append(decl, v)
			}
			for i, a := range c.Args {
				if v, ok := strings.CutPrefix(a, "--model-limits="); ok {
					decl = append(decl, v)
				} else if a == "--model-limits" && i+1 < len(c.Args) {
					decl = append(decl, c.Args[i+1])
				}
			}
			if !slices.ContainsFunc(decl, func(d string) bool { return strings.HasPrefix(d, model+":") }) {
				t.Errorf("%s: %s %s/%s does not declare model %q (--model-limits %s:...): its requests get a 503 at once with no replica up, and nothing queues for KEDA to see", where, w.Kind, w.Name, c.Name, model, model)
			}
			if v, set, known := envValue(o, c, "KVROUTE_COLD_START"); set && known {
				if d, err := time.ParseDuration(v); err != nil || d <= 0 {
					t.Errorf("%s: %s %s/%s: KVROUTE_COLD_START %q, want a positive duration: 0 answers 503 at once", where, w.Kind, w.Name, c.Name, v)
				}
			}
		}
	}
	if !served {
		t.Errorf("%s: no kvroute serve runs to fill the queue", where)
	}
}

// checkTriggerAuth checks that the trigger's TriggerAuthentication exists
// and that the Secret keys it hands KEDA do.
func checkTriggerAuth(t *testing.T, o *objects, where string, tr scaleTrigger) {
	if tr.AuthenticationRef == nil {
		t.Errorf("%s: no authenticationRef: kvroute's Redis takes a password", where)
		return
	}
	if k := tr.AuthenticationRef.Kind; k != "" && k != "TriggerAuthentication" {
		t.Errorf("%s: authenticationRef kind %q, want TriggerAuthentication", where, k)
		return
	}
	ta := o.triggerAuth(tr.AuthenticationRef.Name)
	if ta == nil {
		t.Errorf("%s: TriggerAuthentication %q does not exist", where, tr.AuthenticationRef.Name)
		return
	}
	if !slices.ContainsFunc(ta.Spec.SecretTargetRef, func(r secretTargetRef) bool { return r.Parameter == "password" }) {
		t.Errorf("%s: TriggerAuthentication %s sets no password parameter", where, ta.Name)
	}
	for _, r := range ta.Spec.SecretTargetRef {
		if s := o.secret(r.Name); s == nil {
			t.Errorf("TriggerAuthentication %s: %s: Secret %q does not exist", ta.Name, r.Parameter, r.Name)
		} else if !secretHas(s, r.Key) {
			t.Errorf("TriggerAuthentication %s: %s: Secret %q has no key %q", ta.Name, r.Parameter, r.Name, r.Key)
		}
	}
}

// checkKEDAReaches checks, for an address of a Service in these manifests
// (SERVICE.NAMESPACE.svc[.cluster.local]), that the Service and port
// exist and that the NetworkPolicies admit KEDA's operator to the pods
// behind it. Other addresses (a managed Redis) are outside the cluster.
func checkKEDAReaches(t *testing.T, o *objects, where, namespace, host, port string) {
	name, rest, _ := strings.Cut(host, ".")
	ns, suffix, _ := strings.Cut(rest, ".")
	switch {
	case rest == "" && o.service(name) != nil:
		t.Errorf("%s: address %q is resolved in KEDA's namespace (%s), not in %s: want %s.%s.svc.cluster.local", where, host, kedaNamespace, namespace, name, namespace)
		return
	case suffix == "svc" || suffix == "svc.cluster.local" || (suffix == "" && rest != "" && o.service(name) != nil):
	default:
		return // outside the cluster
	}
	if ns != namespace {
		t.Errorf("%s: address %q is in namespace %q, the manifests in %q", where, host, ns, namespace)
	}
	s := o.service(name)
	if s == nil {
		t.Errorf("%s: address %q names Service %q, which does not exist", where, host, name)
		return
	}
	pn, err := strconv.Atoi(port)
	i := slices.IndexFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return err == nil && p.Port == int32(pn) })
	if i < 0 {
		t.Errorf("%s: port %s is no port of Service %s", where, port, s.Name)
		return
	}
	target := s.Spec.Ports[i].TargetPort
	if target.Type == intstr.Int && target.IntVal == 0 {
		target = intstr.FromInt32(s.Spec.Ports[i].Port)
	}
	for _, w := range o.workloads() {
		if !selectsMap(s.Spec.Selector, w.Template.Labels) || len(o.NetworkPolicies) == 0 {
			continue
		}
		cp, ok := resolvePort(w.Template.Spec.Containers, target)
		if !ok {
			continue // checkServices says so
		}
		if !slices.ContainsFunc(o.NetworkPolicies, func(np networkingv1.NetworkPolicy) bool {
			return selects(&np.Spec.PodSelector, w.Template.Labels) && admitsKEDA(np, cp)
		}) {
			t.Errorf("%s: no NetworkPolicy admits KEDA's operator (namespace %s, %v) to %s %s on port %d", where, kedaNamespace, kedaOperatorLabels, w.Kind, w.Name, cp)
		}
	}
}

// admitsKEDA reports whether np lets KEDA's operator in on port.
func admitsKEDA(np networkingv1.NetworkPolicy, port int32) bool {
	nsLabels := map[string]string{"kubernetes.io/metadata.name": kedaNamespace}
	for _, r := range np.Spec.Ingress {
		if len(r.Ports) > 0 && !slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool {
			return p.Port != nil && p.Port.Type == intstr.Int && p.Port.IntVal == port
		}) {
			continue
		}
		if len(r.From) == 0 {
			return true
		}
		for _, peer := range r.From {
			if peer.NamespaceSelector == nil || peer.IPBlock != nil {
				continue // this namespace's pods only, or addresses
			}
			if selects(peer.NamespaceSelector, nsLabels) && (peer.PodSelector == nil || selects(peer.PodSelector, kedaOperatorLabels)) {
				return true
			}
		}
	}
	return false
}
