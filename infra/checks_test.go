package infra_test

import (
	"net"
	"path"
	"slices"
	"strconv"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// servedPaths are the HTTP paths each kvroute command serves that
// manifests may point probes and scrapers at. TestProbePathsAnswer checks
// them against the running binary.
var servedPaths = map[string][]string{
	"serve":       {"/healthz", "/readyz", "/metrics"},
	"ingest":      {"/healthz", "/metrics"},
	"sim-replica": {"/health", "/metrics"},
}

// defaultListen is where each command listens when its manifest does not
// say (its flag's default).
var defaultListen = map[string]string{"serve": ":8080", "ingest": ":9091", "sim-replica": ":8000"}

type envSets = map[string]map[string]bool

type check struct {
	name string
	run  func(t *testing.T, o *objects, env envSets, exposed map[int32]bool)
}

var checks = []check{
	{"selectors match their own templates only", checkSelectors},
	{"services reach container ports", checkServices},
	{"probes hit served paths on container ports", checkProbes},
	{"prometheus annotations name a metrics port", checkScrape},
	{"listen addresses match container ports and EXPOSE", checkListen},
	{"env names are read by the binary", checkEnvNames},
	{"configmap and secret references resolve", checkRefs},
	{"containers are locked down", checkSecurity},
	{"containers have requests and limits", checkResources},
	{"disruption budgets select workloads", checkPDBs},
	{"autoscalers target what exists, one each", checkAutoscalers},
	{"KEDA scales from zero on kvroute's queue", checkScaledObjects},
	{"network policies admit what runs", checkNetworkPolicies},
	{"block-key seed is one value", checkSeed},
	{"ingestors share leases", checkIngest},
	{"args name flags the command knows", checkArgs},
	{"API access is what discovery needs, and only there", checkAPIAccess},
}

// kvrouteContainer reports whether c runs the kvroute image, and which
// command: the image's CMD is "serve".
func kvrouteContainer(c corev1.Container) (command string, ok bool) {
	repo := c.Image
	if i := strings.LastIndex(repo, "@"); i >= 0 {
		repo = repo[:i]
	}
	if i := strings.LastIndex(repo, ":"); i > strings.LastIndex(repo, "/") {
		repo = repo[:i]
	}
	if path.Base(repo) != "kvroute" {
		return "", false
	}
	if len(c.Command) > 0 {
		return "", false // the entrypoint replaced: not the binary's flags
	}
	if len(c.Args) == 0 {
		return "serve", true
	}
	return c.Args[0], true
}

func selects(sel *metav1.LabelSelector, set map[string]string) bool {
	if sel == nil {
		return false
	}
	s, err := metav1.LabelSelectorAsSelector(sel)
	if err != nil {
		return false
	}
	return s.Matches(labels.Set(set))
}

func selectsMap(sel map[string]string, set map[string]string) bool {
	return len(sel) > 0 && labels.SelectorFromSet(sel).Matches(labels.Set(set))
}

// resolvePort finds the container port a probe or Service names, by name
// or by number.
func resolvePort(cs []corev1.Container, p intstr.IntOrString) (int32, bool) {
	for _, c := range cs {
		for _, cp := range c.Ports {
			if (p.Type == intstr.String && cp.Name == p.StrVal) || (p.Type == intstr.Int && cp.ContainerPort == p.IntVal) {
				return cp.ContainerPort, true
			}
		}
	}
	return 0, false
}

// envValue is the value c's environment gives name, as Kubernetes builds
// it (env over envFrom, later envFrom over earlier); known is false for
// values from Secrets or the downward API.
func envValue(o *objects, c corev1.Container, name string) (value string, set, known bool) {
	for i := len(c.Env) - 1; i >= 0; i-- {
		e := c.Env[i]
		if e.Name != name {
			continue
		}
		if e.ValueFrom == nil {
			return e.Value, true, true
		}
		if r := e.ValueFrom.ConfigMapKeyRef; r != nil {
			if cm := o.configMap(r.Name); cm != nil {
				v, ok := cm.Data[r.Key]
				return v, ok, ok
			}
		}
		return "", true, false
	}
	for i := len(c.EnvFrom) - 1; i >= 0; i-- {
		ef := c.EnvFrom[i]
		if ef.ConfigMapRef != nil {
			if cm := o.configMap(ef.ConfigMapRef.Name); cm != nil {
				if v, ok := cm.Data[strings.TrimPrefix(name, ef.Prefix)]; ok && strings.HasPrefix(name, ef.Prefix) {
					return v, true, true
				}
			}
		}
		if ef.SecretRef != nil {
			if s := o.secret(ef.SecretRef.Name); s != nil && secretHas(s, strings.TrimPrefix(name, ef.Prefix)) {
				return "", true, false
			}
		}
	}
	return "", false, false
}

func secretHas(s *corev1.Secret, key string) bool {
	_, a := s.Data[key]
	_, b := s.StringData[key]
	return a || b
}

// envNamesOf lists every variable c's environment sets.
func envNamesOf(o *objects, c corev1.Container) []string {
	var names []string
	for _, e := range c.Env {
		names = append(names, e.Name)
	}
	for _, ef := range c.EnvFrom {
		if ef.ConfigMapRef != nil {
			if cm := o.configMap(ef.ConfigMapRef.Name); cm != nil {
				for k := range cm.Data {
					names = append(names, ef.Prefix+k)
				}
			}
		}
		if ef.SecretRef != nil {
			if s := o.secret(ef.SecretRef.Name); s != nil {
				for k := range s.Data {
					names = append(names, ef.Prefix+k)
				}
				for k := range s.StringData {
					names = append(names, ef.Prefix+k)
				}
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

func checkSelectors(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	ws := o.workloads()
	for _, w := range ws {
		if !selects(w.Selector, w.Template.Labels) {
			t.Errorf("%s %s: selector %v does not match its template's labels %v", w.Kind, w.Name, w.Selector, w.Template.Labels)
		}
		for _, other := range ws {
			if other.Name != w.Name && selects(w.Selector, other.Template.Labels) {
				t.Errorf("%s %s: selector also matches %s %s's pods", w.Kind, w.Name, other.Kind, other.Name)
			}
		}
	}
}

func checkServices(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	for _, s := range o.Services {
		var backs []workload
		for _, w := range o.workloads() {
			if selectsMap(s.Spec.Selector, w.Template.Labels) {
				backs = append(backs, w)
			}
		}
		if len(backs) == 0 {
			t.Errorf("Service %s: selector %v matches no workload's pods", s.Name, s.Spec.Selector)
			continue
		}
		for _, p := range s.Spec.Ports {
			target := p.TargetPort
			if target.Type == intstr.Int && target.IntVal == 0 {
				target = intstr.FromInt32(p.Port)
			}
			for _, w := range backs {
				if _, ok := resolvePort(w.Template.Spec.Containers, target); !ok {
					t.Errorf("Service %s port %s: targetPort %s is no container port of %s %s", s.Name, p.Name, target.String(), w.Kind, w.Name)
				}
			}
		}
	}
	for _, ss := range o.StatefulSets {
		s := o.service(ss.Spec.ServiceName)
		switch {
		case s == nil:
			t.Errorf("StatefulSet %s: serviceName %q names no Service", ss.Name, ss.Spec.ServiceName)
		case s.Spec.ClusterIP != corev1.ClusterIPNone:
			t.Errorf("StatefulSet %s: Service %s has clusterIP %q, want None (headless)", ss.Name, s.Name, s.Spec.ClusterIP)
		}
	}
}

func checkProbes(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	for _, w := range o.workloads() {
		cs := w.Template.Spec.Containers
		for _, c := range cs {
			cmd, isKV := kvrouteContainer(c)
			probes := map[string]*corev1.Probe{"readiness": c.ReadinessProbe, "liveness": c.LivenessProbe, "startup": c.StartupProbe}
			for kind, p := range probes {
				if p == nil {
					continue
				}
				switch {
				case p.HTTPGet != nil:
					if _, ok := resolvePort(cs, p.HTTPGet.Port); !ok {
						t.Errorf("%s %s/%s %s probe: port %s is no container port", w.Kind, w.Name, c.Name, kind, p.HTTPGet.Port.String())
					}
					if isKV && !slices.Contains(servedPaths[cmd], p.HTTPGet.Path) {
						t.Errorf("%s %s/%s %s probe: kvroute %s serves no %s (it serves %v)", w.Kind, w.Name, c.Name, kind, cmd, p.HTTPGet.Path, servedPaths[cmd])
					}
				case p.TCPSocket != nil:
					if _, ok := resolvePort(cs, p.TCPSocket.Port); !ok {
						t.Errorf("%s %s/%s %s probe: port %s is no container port", w.Kind, w.Name, c.Name, kind, p.TCPSocket.Port.String())
					}
				}
			}
			if !isKV {
				continue
			}
			if c.ReadinessProbe == nil || c.LivenessProbe == nil {
				t.Errorf("%s %s/%s: readiness %v, liveness %v: want both", w.Kind, w.Name, c.Name, c.ReadinessProbe != nil, c.LivenessProbe != nil)
				continue
			}
			want := map[string]struct{ ready, live string }{"serve": {"/readyz", "/healthz"}, "ingest": {"/healthz", "/healthz"}, "sim-replica": {"/health", "/health"}}[cmd]
			if got := httpPath(c.ReadinessProbe); got != want.ready {
				t.Errorf("%s %s/%s: readiness probe path %q, want %q", w.Kind, w.Name, c.Name, got, want.ready)
			}
			if got := httpPath(c.LivenessProbe); got != want.live {
				t.Errorf("%s %s/%s: liveness probe path %q, want %q (never one that depends on Redis)", w.Kind, w.Name, c.Name, got, want.live)
			}
		}
	}
}

func httpPath(p *corev1.Probe) string {
	if p == nil || p.HTTPGet == nil {
		return ""
	}
	return p.HTTPGet.Path
}

func checkScrape(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	for _, w := range o.workloads() {
		a := w.Template.Annotations
		if a["prometheus.io/scrape"] != "true" {
			if _, ok := kvrouteContainer(w.Template.Spec.Containers[0]); ok {
				t.Errorf("%s %s: kvroute pods without prometheus.io/scrape: \"true\"", w.Kind, w.Name)
			}
			continue
		}
		port, err := strconv.Atoi(a["prometheus.io/port"])
		if err != nil {
			t.Errorf("%s %s: prometheus.io/port %q: %v", w.Kind, w.Name, a["prometheus.io/port"], err)
			continue
		}
		found := false
		for _, c := range w.Template.Spec.Containers {
			cmd, isKV := kvrouteContainer(c)
			if _, ok := resolvePort([]corev1.Container{c}, intstr.FromInt(port)); ok && isKV {
				found = true
				if p := a["prometheus.io/path"]; !slices.Contains(servedPaths[cmd], p) || p != "/metrics" {
					t.Errorf("%s %s: prometheus.io/path %q, want /metrics (kvroute %s serves %v)", w.Kind, w.Name, p, cmd, servedPaths[cmd])
				}
			}
		}
		if !found {
			t.Errorf("%s %s: prometheus.io/port %d is no kvroute container's port", w.Kind, w.Name, port)
		}
	}
}

func checkListen(t *testing.T, o *objects, _ envSets, exposed map[int32]bool) {
	listenVar := map[string]string{"serve": "KVROUTE_LISTEN", "ingest": "KVROUTE_METRICS_LISTEN", "sim-replica": "KVROUTE_LISTEN"}
	for _, w := range o.workloads() {
		for _, c := range w.Template.Spec.Containers {
			cmd, ok := kvrouteContainer(c)
			if !ok {
				continue
			}
			addr, set, known := envValue(o, c, listenVar[cmd])
			if !set {
				addr, known = defaultListen[cmd], true
			}
			if !known {
				t.Errorf("%s %s/%s: %s comes from a Secret or the downward API; its port cannot be checked", w.Kind, w.Name, c.Name, listenVar[cmd])
				continue
			}
			_, ps, err := net.SplitHostPort(addr)
			port, perr := strconv.Atoi(ps)
			if err != nil || perr != nil {
				t.Errorf("%s %s/%s: %s=%q is no host:port", w.Kind, w.Name, c.Name, listenVar[cmd], addr)
				continue
			}
			if _, ok := resolvePort([]corev1.Container{c}, intstr.FromInt(port)); !ok {
				t.Errorf("%s %s/%s: listens on %d (%s) but declares ports %v", w.Kind, w.Name, c.Name, port, listenVar[cmd], c.Ports)
			}
			for _, cp := range c.Ports {
				// The Dockerfile EXPOSEs the production commands' ports; a
				// simulated replica's are vLLM's (as in compose.yaml).
				if cmd != "sim-replica" && !exposed[cp.ContainerPort] {
					t.Errorf("%s %s/%s: container port %d is not EXPOSEd by the Dockerfile (%v)", w.Kind, w.Name, c.Name, cp.ContainerPort, exposed)
				}
			}
		}
	}
}

func checkEnvNames(t *testing.T, o *objects, env envSets, _ map[int32]bool) {
	for _, w := range o.workloads() {
		for _, c := range w.Template.Spec.Containers {
			cmd, ok := kvrouteContainer(c)
			if !ok {
				continue
			}
			if env[cmd] == nil {
				t.Errorf("%s %s/%s: runs kvroute %q, not serve or ingest", w.Kind, w.Name, c.Name, cmd)
				continue
			}
			for _, name := range envNamesOf(o, c) {
				switch {
				case env[cmd][name]:
				case pendingEnv[name] != "":
					t.Logf("%s %s/%s: %s is not read by kvroute %s yet (pending: %s)", w.Kind, w.Name, c.Name, name, cmd, pendingEnv[name])
				default:
					t.Errorf("%s %s/%s: sets %s, which kvroute %s does not read (kvroute %s -h)", w.Kind, w.Name, c.Name, name, cmd, cmd)
				}
			}
		}
	}
}

func checkRefs(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	for _, w := range o.workloads() {
		spec := w.Template.Spec
		where := w.Kind + " " + w.Name
		if sa := spec.ServiceAccountName; sa != "" && sa != "default" && !slices.ContainsFunc(o.ServiceAccounts, func(s corev1.ServiceAccount) bool { return s.Name == sa }) {
			t.Errorf("%s: serviceAccountName %q names no ServiceAccount", where, sa)
		}
		for _, c := range append(slices.Clone(spec.InitContainers), spec.Containers...) {
			for _, ef := range c.EnvFrom {
				if r := ef.ConfigMapRef; r != nil && o.configMap(r.Name) == nil && !isTrue(r.Optional) {
					t.Errorf("%s/%s: envFrom ConfigMap %q does not exist", where, c.Name, r.Name)
				}
				if r := ef.SecretRef; r != nil && o.secret(r.Name) == nil && !isTrue(r.Optional) {
					t.Errorf("%s/%s: envFrom Secret %q does not exist", where, c.Name, r.Name)
				}
			}
			for _, e := range c.Env {
				if e.ValueFrom == nil {
					continue
				}
				if r := e.ValueFrom.ConfigMapKeyRef; r != nil && !isTrue(r.Optional) {
					if cm := o.configMap(r.Name); cm == nil {
						t.Errorf("%s/%s: %s: ConfigMap %q does not exist", where, c.Name, e.Name, r.Name)
					} else if _, ok := cm.Data[r.Key]; !ok {
						t.Errorf("%s/%s: %s: ConfigMap %q has no key %q", where, c.Name, e.Name, r.Name, r.Key)
					}
				}
				if r := e.ValueFrom.SecretKeyRef; r != nil && !isTrue(r.Optional) {
					if s := o.secret(r.Name); s == nil {
						t.Errorf("%s/%s: %s: Secret %q does not exist", where, c.Name, e.Name, r.Name)
					} else if !secretHas(s, r.Key) {
						t.Errorf("%s/%s: %s: Secret %q has no key %q", where, c.Name, e.Name, r.Name, r.Key)
					}
				}
			}
		}
		for _, v := range spec.Volumes {
			if cm := v.ConfigMap; cm != nil && o.configMap(cm.Name) == nil {
				t.Errorf("%s: volume %s: ConfigMap %q does not exist", where, v.Name, cm.Name)
			}
			if s := v.Secret; s != nil && o.secret(s.SecretName) == nil {
				t.Errorf("%s: volume %s: Secret %q does not exist", where, v.Name, s.SecretName)
			}
		}
	}
}

func isTrue(b *bool) bool { return b != nil && *b }

func checkSecurity(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	for _, w := range o.workloads() {
		spec := w.Template.Spec
		psc := spec.SecurityContext
		if psc == nil {
			psc = &corev1.PodSecurityContext{}
		}
		if spec.AutomountServiceAccountToken == nil {
			t.Errorf("%s %s: automountServiceAccountToken unset; want false, or true where discovery reads the API server (checkAPIAccess)", w.Kind, w.Name)
		}
		for _, c := range spec.Containers {
			sc := c.SecurityContext
			if sc == nil {
				t.Errorf("%s %s/%s: no securityContext", w.Kind, w.Name, c.Name)
				continue
			}
			where := w.Kind + " " + w.Name + "/" + c.Name
			if !isTrue(sc.RunAsNonRoot) && !isTrue(psc.RunAsNonRoot) {
				t.Errorf("%s: runAsNonRoot not set", where)
			}
			if uid := firstNonNil(sc.RunAsUser, psc.RunAsUser); uid == nil || *uid == 0 {
				t.Errorf("%s: runAsUser %v, want a numeric non-root UID", where, uid)
			}
			if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
				t.Errorf("%s: allowPrivilegeEscalation not false", where)
			}
			if !isTrue(sc.ReadOnlyRootFilesystem) {
				t.Errorf("%s: readOnlyRootFilesystem not true", where)
			}
			if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
				t.Errorf("%s: capabilities %v, want drop [ALL] and no add", where, sc.Capabilities)
			}
			sp := sc.SeccompProfile
			if sp == nil {
				sp = psc.SeccompProfile
			}
			if sp == nil || sp.Type != corev1.SeccompProfileTypeRuntimeDefault {
				t.Errorf("%s: seccompProfile %v, want RuntimeDefault", where, sp)
			}
		}
	}
}

func firstNonNil[T any](ps ...*T) *T {
	for _, p := range ps {
		if p != nil {
			return p
		}
	}
	return nil
}

func checkResources(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	for _, w := range o.workloads() {
		for _, c := range w.Template.Spec.Containers {
			for _, r := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
				req, okReq := c.Resources.Requests[r]
				lim, okLim := c.Resources.Limits[r]
				if !okReq || !okLim {
					t.Errorf("%s %s/%s: %s request set %v, limit set %v: want both", w.Kind, w.Name, c.Name, r, okReq, okLim)
					continue
				}
				if req.Cmp(lim) > 0 {
					t.Errorf("%s %s/%s: %s request %s above limit %s", w.Kind, w.Name, c.Name, r, req.String(), lim.String())
				}
			}
		}
	}
}

func checkPDBs(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	for _, p := range o.PDBs {
		n := 0
		for _, w := range o.workloads() {
			if selects(p.Spec.Selector, w.Template.Labels) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("PodDisruptionBudget %s: selector matches no workload's pods", p.Name)
		}
	}
}

func checkAutoscalers(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	scaled := map[string]string{}
	claim := func(deploy, by string) {
		if prev, ok := scaled[deploy]; ok {
			t.Errorf("Deployment %s is scaled by both %s and %s: they would fight over its replicas", deploy, prev, by)
		}
		scaled[deploy] = by
		d := o.deployment(deploy)
		if d == nil {
			t.Errorf("%s: targets Deployment %q, which does not exist", by, deploy)
			return
		}
		if d.Spec.Replicas != nil {
			t.Errorf("Deployment %s sets replicas %d while %s scales it: every apply would reset the count", deploy, *d.Spec.Replicas, by)
		}
	}
	for _, h := range o.HPAs {
		ref := h.Spec.ScaleTargetRef
		if ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" {
			t.Errorf("HorizontalPodAutoscaler %s: targets %s %s, want apps/v1 Deployment", h.Name, ref.APIVersion, ref.Kind)
		}
		claim(ref.Name, "HorizontalPodAutoscaler "+h.Name)
	}
	claimScaled(o, claim)
	for _, h := range o.HTTPScaled {
		ref := h.Spec.ScaleTargetRef
		by := "HTTPScaledObject " + h.Name
		if ref.Kind != "Deployment" || ref.APIVersion != "apps/v1" {
			t.Errorf("%s: targets %s %s, want apps/v1 Deployment", by, ref.APIVersion, ref.Kind)
		}
		claim(ref.Name, by)
		s := o.service(ref.Service)
		if s == nil {
			t.Errorf("%s: service %q does not exist", by, ref.Service)
			continue
		}
		if !slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Port == ref.Port }) {
			t.Errorf("%s: port %d is no port of Service %s", by, ref.Port, s.Name)
		}
		if d := o.deployment(ref.Name); d != nil && !selectsMap(s.Spec.Selector, d.Spec.Template.Labels) {
			t.Errorf("%s: Service %s does not select Deployment %s's pods", by, s.Name, d.Name)
		}
		if len(h.Spec.Hosts) == 0 {
			t.Errorf("%s: no hosts: the interceptor would route nothing to it", by)
		}
		if h.Spec.Replicas.Max == nil || *h.Spec.Replicas.Max < 1 {
			t.Errorf("%s: replicas.max %v, want at least 1", by, h.Spec.Replicas.Max)
		}
	}
}

// claimScaled adds the ScaledObjects to checkAutoscalers' claims: KEDA
// makes an HPA of its own for each, which would fight any other.
func claimScaled(o *objects, claim func(deploy, by string)) {
	for _, so := range o.Scaled {
		claim(so.Spec.ScaleTargetRef.Name, "ScaledObject "+so.Name)
	}
}

// wantEgress are the ports each kvroute command must be able to reach.
var wantEgress = map[string][]int32{
	"serve":  {53, 6379, 8000},
	"ingest": {53, 6379, 5557, 5558, 8000},
}

func checkNetworkPolicies(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	for _, np := range o.NetworkPolicies {
		if len(np.Spec.PodSelector.MatchLabels) == 0 && len(np.Spec.PodSelector.MatchExpressions) == 0 {
			continue // the namespace's default deny
		}
		n := 0
		for _, w := range o.workloads() {
			if selects(&np.Spec.PodSelector, w.Template.Labels) {
				n++
			}
		}
		if n == 0 {
			t.Errorf("NetworkPolicy %s: podSelector matches no workload's pods", np.Name)
		}
		for _, r := range np.Spec.Ingress {
			for _, peer := range r.From {
				if peer.PodSelector != nil && peer.NamespaceSelector == nil {
					m := 0
					for _, w := range o.workloads() {
						if selects(peer.PodSelector, w.Template.Labels) {
							m++
						}
					}
					if m == 0 {
						t.Errorf("NetworkPolicy %s: ingress from podSelector %v matches no workload's pods", np.Name, peer.PodSelector.MatchLabels)
					}
				}
			}
		}
	}
	// Every declared container port is admitted by some policy that
	// selects its pods (the default deny blocks the rest), and every
	// kvroute command can reach what it dials.
	for _, w := range o.workloads() {
		var in, out []int32
		for _, np := range o.NetworkPolicies {
			if !selects(&np.Spec.PodSelector, w.Template.Labels) {
				continue
			}
			for _, r := range np.Spec.Ingress {
				for _, p := range r.Ports {
					if p.Port != nil {
						in = append(in, p.Port.IntVal)
					}
				}
			}
			for _, r := range np.Spec.Egress {
				for _, p := range r.Ports {
					if p.Port != nil {
						out = append(out, p.Port.IntVal)
					}
				}
			}
		}
		for _, c := range w.Template.Spec.Containers {
			for _, cp := range c.Ports {
				if !slices.Contains(in, cp.ContainerPort) {
					t.Errorf("%s %s/%s: port %d is admitted by no NetworkPolicy", w.Kind, w.Name, c.Name, cp.ContainerPort)
				}
			}
			cmd, ok := kvrouteContainer(c)
			if !ok || len(o.NetworkPolicies) == 0 {
				continue
			}
			for _, p := range wantEgress[cmd] {
				if !slices.Contains(out, p) {
					t.Errorf("%s %s/%s: kvroute %s must reach port %d; no NetworkPolicy allows egress to it", w.Kind, w.Name, c.Name, cmd, p)
				}
			}
		}
	}
}

func checkSeed(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	seeds := map[string][]string{}
	for _, w := range o.workloads() {
		for _, c := range w.Template.Spec.Containers {
			if _, ok := kvrouteContainer(c); !ok {
				continue
			}
			v, set, known := envValue(o, c, "KVROUTE_SEED")
			if !set {
				v, known = "0", true
			}
			if !known {
				v = "(secret)"
			}
			seeds[v] = append(seeds[v], w.Name+"/"+c.Name)
		}
	}
	if len(seeds) > 1 {
		t.Errorf("KVROUTE_SEED differs across pods sharing one Redis (block keys would not match): %v", seeds)
	}
}

func checkIngest(t *testing.T, o *objects, _ envSets, _ map[int32]bool) {
	for _, w := range o.workloads() {
		for _, c := range w.Template.Spec.Containers {
			if cmd, ok := kvrouteContainer(c); !ok || cmd != "ingest" {
				continue
			}
			if w.Replicas == nil || *w.Replicas < 2 {
				t.Errorf("%s %s: replicas %v, want at least 2 (a dead ingestor's leases need a taker)", w.Kind, w.Name, w.Replicas)
			}
			owner := slices.IndexFunc(c.Env, func(e corev1.EnvVar) bool { return e.Name == "KVROUTE_OWNER" })
			if owner < 0 || c.Env[owner].ValueFrom == nil || c.Env[owner].ValueFrom.FieldRef == nil || c.Env[owner].ValueFrom.FieldRef.FieldPath != "metadata.name" {
				t.Errorf("%s %s/%s: KVROUTE_OWNER must come from the pod's name (fieldRef metadata.name): a lease owner unique per pod", w.Kind, w.Name, c.Name)
			}
			if !slices.ContainsFunc(o.PDBs, func(p policyPDB) bool { return selects(p.Spec.Selector, w.Template.Labels) }) {
				t.Errorf("%s %s: no PodDisruptionBudget keeps an ingestor through drains", w.Kind, w.Name)
			}
		}
	}
}
