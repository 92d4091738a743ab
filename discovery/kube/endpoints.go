package kube

import (
	"cmp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"

	"github.com/kvroute/kvroute/discovery"
)

// Labels the source copies to an endpoint, for operators reading
// GET /v1/replicas.
const (
	labelZone = "topology.kubernetes.io/zone"
	labelNode = "kubernetes.io/hostname"
)

// sliceEndpoints turns a Service's EndpointSlices into endpoints. An
// endpoint that is terminating (serving or not) is reported Terminating,
// so that it takes no new requests while those in flight finish; one that
// is not ready and not terminating is still starting and is left out. A
// pod in two slices (dual stack: an IPv4 and an IPv6 slice) is reported
// once, from the first slice by address type then name, so that its
// replica does not flap between addresses.
func sliceEndpoints(list []*discoveryv1.EndpointSlice, cfg Config) []discovery.Endpoint {
	list = slices.Clone(list)
	slices.SortFunc(list, func(a, b *discoveryv1.EndpointSlice) int {
		return cmp.Or(cmp.Compare(a.AddressType, b.AddressType), cmp.Compare(a.Name, b.Name))
	})
	seen := map[string]bool{}
	var out []discovery.Endpoint
	for _, sl := range list {
		if sl.AddressType == discoveryv1.AddressTypeFQDN {
			continue // not an address a pod has; kvroute dials IPs here
		}
		named, unnamed := slicePorts(sl.Ports)
		httpPort, events, replay := ports(named, unnamed, cfg)
		for _, e := range sl.Endpoints {
			if len(e.Addresses) == 0 {
				continue
			}
			terminating := isTrue(e.Conditions.Terminating)
			// Ready nil is ready: the API's own reading of an unknown state.
			if !terminating && e.Conditions.Ready != nil && !*e.Conditions.Ready {
				continue
			}
			name := e.Addresses[0]
			if e.TargetRef != nil && e.TargetRef.Name != "" {
				name = e.TargetRef.Name
			}
			if seen[name] {
				continue
			}
			seen[name] = true
			ls := map[string]string{}
			if e.Zone != nil && *e.Zone != "" {
				ls[labelZone] = *e.Zone
			}
			if e.NodeName != nil && *e.NodeName != "" {
				ls[labelNode] = *e.NodeName
			}
			out = append(out, discovery.Endpoint{
				Name: name, Host: e.Addresses[0], HTTPPort: httpPort, EventsPort: events, ReplayPort: replay,
				Terminating: terminating, Model: sl.Labels[ModelLabel], Labels: nilIfEmpty(ls),
			})
		}
	}
	sortEndpoints(out)
	return out
}

func slicePorts(ps []discoveryv1.EndpointPort) (named map[string]int, unnamed []int) {
	named = map[string]int{}
	for _, p := range ps {
		if p.Port == nil || (p.Protocol != nil && *p.Protocol != corev1.ProtocolTCP) {
			continue
		}
		if p.Name == nil || *p.Name == "" {
			unnamed = append(unnamed, int(*p.Port))
			continue
		}
		named[*p.Name] = int(*p.Port)
	}
	return named, unnamed
}

// podEndpoints turns the selected pods into endpoints: a ready pod is
// serving, a pod being deleted is Terminating (it still serves what it
// took), and one not ready yet, without an address, or finished is left
// out.
func podEndpoints(pods []*corev1.Pod, cfg Config) []discovery.Endpoint {
	var out []discovery.Endpoint
	for _, p := range pods {
		if p.Status.PodIP == "" || p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		terminating := p.DeletionTimestamp != nil
		if !terminating && !podReady(p) {
			continue
		}
		named, unnamed := containerPorts(p)
		httpPort, events, replay := ports(named, unnamed, cfg)
		var ls map[string]string
		if p.Spec.NodeName != "" {
			ls = map[string]string{labelNode: p.Spec.NodeName}
		}
		out = append(out, discovery.Endpoint{
			Name: p.Name, Host: p.Status.PodIP, HTTPPort: httpPort, EventsPort: events, ReplayPort: replay,
			Terminating: terminating, Model: p.Labels[ModelLabel], Labels: ls,
		})
	}
	sortEndpoints(out)
	return out
}

func podReady(p *corev1.Pod) bool {
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

func containerPorts(p *corev1.Pod) (named map[string]int, unnamed []int) {
	named = map[string]int{}
	for _, c := range p.Spec.Containers {
		for _, cp := range c.Ports {
			if cp.Protocol != "" && cp.Protocol != corev1.ProtocolTCP {
				continue
			}
			if cp.Name == "" {
				unnamed = append(unnamed, int(cp.ContainerPort))
				continue
			}
			named[cp.Name] = int(cp.ContainerPort)
		}
	}
	return named, unnamed
}

// sortEndpoints orders a set by name, so that two reports of one set
// compare equal whatever order the informer's cache lists them in.
func sortEndpoints(es []discovery.Endpoint) {
	slices.SortFunc(es, func(a, b discovery.Endpoint) int { return strings.Compare(a.Name, b.Name) })
}

func isTrue(b *bool) bool { return b != nil && *b }

func nilIfEmpty(m map[string]string) map[string]string {
	if len(m) == 0 {
		return nil
	}
	return m
}
