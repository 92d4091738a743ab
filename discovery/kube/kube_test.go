package kube_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"reflect"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/kube"
)

const ns = "fleet"

// bound caps how long a test waits for an update that should come; the
// tests wait on the updates themselves, never on the clock.
const bound = 20 * time.Second

// watcher runs a source and hands every set it reports to a channel.
type watcher struct {
	tb      testing.TB
	updates chan []discovery.Endpoint
	last    []discovery.Endpoint
	seen    bool // last holds a reported set
}

func start(tb testing.TB, cfg kube.Config) *watcher {
	tb.Helper()
	src, err := kube.New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	w := &watcher{tb: tb, updates: make(chan []discovery.Endpoint, 64)}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, func(es []discovery.Endpoint) { w.updates <- es }) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if !errors.Is(err, context.Canceled) {
				tb.Errorf("Run returned %v, want context.Canceled", err)
			}
		case <-time.After(bound):
			tb.Errorf("Run did not return within %v of its context ending", bound)
		}
	})
	return w
}

// until waits for a reported set equal to want; sets between (a burst
// coalesced differently) are allowed.
func (w *watcher) until(what string, want []discovery.Endpoint) {
	w.tb.Helper()
	timeout := time.After(bound)
	for {
		if w.seen && (reflect.DeepEqual(w.last, want) || len(w.last) == 0 && len(want) == 0) {
			return
		}
		select {
		case w.last = <-w.updates:
			w.seen = true
		case <-timeout:
			w.tb.Fatalf("%s: last set reported %+v, want %+v", what, w.last, want)
		}
	}
}

// next is the next set reported.
func (w *watcher) next(what string) []discovery.Endpoint {
	w.tb.Helper()
	select {
	case w.last = <-w.updates:
		w.seen = true
		return w.last
	case <-time.After(bound):
		w.tb.Fatalf("%s: no set reported", what)
		return nil
	}
}

func ptr[T any](v T) *T { return &v }

func port(name string, p int32) discoveryv1.EndpointPort {
	ep := discoveryv1.EndpointPort{Port: ptr(p), Protocol: ptr(corev1.ProtocolTCP)}
	if name != "" {
		ep.Name = ptr(name)
	}
	return ep
}

func ep(pod, addr string, ready, serving, terminating bool) discoveryv1.Endpoint {
	return discoveryv1.Endpoint{
		Addresses:  []string{addr},
		Conditions: discoveryv1.EndpointConditions{Ready: ptr(ready), Serving: ptr(serving), Terminating: ptr(terminating)},
		TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: ns, Name: pod},
		Zone:       ptr("zone-a"),
	}
}

func slice(name, svc string, ports []discoveryv1.EndpointPort, eps ...discoveryv1.Endpoint) *discoveryv1.EndpointSlice {
	return &discoveryv1.EndpointSlice{
		ObjectMeta:  metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{discoveryv1.LabelServiceName: svc}},
		AddressType: discoveryv1.AddressTypeIPv4,
		Ports:       ports,
		Endpoints:   eps,
	}
}

var zoneA = map[string]string{"topology.kubernetes.io/zone": "zone-a"}

func TestServiceLifecycle(t *testing.T) {
	ctx := context.Background()
	client := fake.NewClientset()
	slices := client.DiscoveryV1().EndpointSlices(ns)
	w := start(t, kube.Config{Namespace: ns, Service: "vllm", HTTPPort: 8000, EventsPort: 5557, ReplayPort: 5558, Client: client})
	w.until("initial sync of an empty Service", []discovery.Endpoint{})

	threePorts := []discoveryv1.EndpointPort{port("http", 8080), port("kv-events", 6557), port("kv-replay", 6558)}
	s := slice("vllm-abc", "vllm", threePorts, ep("vllm-0", "10.0.0.1", true, true, false))
	if _, err := slices.Create(ctx, s, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// A slice of another Service in the same namespace is not this source's.
	if _, err := slices.Create(ctx, slice("other-x", "other", threePorts, ep("other-0", "10.0.9.9", true, true, false)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	vllm0 := discovery.Endpoint{Name: "vllm-0", Host: "10.0.0.1", HTTPPort: 8080, EventsPort: 6557, ReplayPort: 6558, Labels: zoneA}
	w.until("add", []discovery.Endpoint{vllm0})

	t.Run("a change kvroute does not read is not reported", func(t *testing.T) {
		s.Annotations = map[string]string{"note": "irrelevant"}
		s = update(t, slices, s)
		s.Endpoints[0].Addresses = []string{"10.0.0.11"}
		s = update(t, slices, s)
		moved := vllm0
		moved.Host = "10.0.0.11"
		if got := w.next("after an annotation, then a new address"); !reflect.DeepEqual(got, []discovery.Endpoint{moved}) {
			t.Errorf("next set reported %+v, want only the moved endpoint %+v (the unchanged set is not reported again)", got, moved)
		}
		s.Endpoints[0].Addresses = []string{"10.0.0.1"}
		s = update(t, slices, s)
		w.until("address back", []discovery.Endpoint{vllm0})
	})
	t.Run("not ready is left out until ready", func(t *testing.T) {
		s.Endpoints = append(s.Endpoints, ep("vllm-1", "10.0.0.2", false, false, false))
		s = update(t, slices, s)
		s.Endpoints[0].Conditions.Ready = ptr(true) // a change the source must see through
		s.Labels[kube.ModelLabel] = "qwen"
		s = update(t, slices, s)
		vllm0.Model = "qwen"
		w.until("a not-ready endpoint added", []discovery.Endpoint{vllm0})
		s.Endpoints[1].Conditions = discoveryv1.EndpointConditions{Ready: ptr(true), Serving: ptr(true), Terminating: ptr(false)}
		s = update(t, slices, s)
		vllm1 := discovery.Endpoint{Name: "vllm-1", Host: "10.0.0.2", HTTPPort: 8080, EventsPort: 6557, ReplayPort: 6558, Model: "qwen", Labels: zoneA}
		w.until("it became ready", []discovery.Endpoint{vllm0, vllm1})
	})
	t.Run("terminating", func(t *testing.T) {
		// Serving while terminating, then no longer serving: both drain.
		s.Endpoints[0].Conditions = discoveryv1.EndpointConditions{Ready: ptr(false), Serving: ptr(true), Terminating: ptr(true)}
		s = update(t, slices, s)
		s.Endpoints[0].Conditions.Serving = ptr(false)
		s = update(t, slices, s)
		draining := vllm0
		draining.Terminating = true
		vllm1 := discovery.Endpoint{Name: "vllm-1", Host: "10.0.0.2", HTTPPort: 8080, EventsPort: 6557, ReplayPort: 6558, Model: "qwen", Labels: zoneA}
		w.until("vllm-0 terminating", []discovery.Endpoint{draining, vllm1})
		s.Endpoints = s.Endpoints[1:]
		s = update(t, slices, s)
		w.until("vllm-0 gone from the slice", []discovery.Endpoint{vllm1})
	})
	t.Run("delete", func(t *testing.T) {
		if err := slices.Delete(ctx, s.Name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		w.until("slice deleted", []discovery.Endpoint{})
	})
}

type sliceClient interface {
	Update(context.Context, *discoveryv1.EndpointSlice, metav1.UpdateOptions) (*discoveryv1.EndpointSlice, error)
}

func update(tb testing.TB, c sliceClient, s *discoveryv1.EndpointSlice) *discoveryv1.EndpointSlice {
	tb.Helper()
	got, err := c.Update(context.Background(), s, metav1.UpdateOptions{})
	if err != nil {
		tb.Fatalf("update %s: %v", s.Name, err)
	}
	return got
}

func TestServicePorts(t *testing.T) {
	for _, tc := range []struct {
		name  string
		ports []discoveryv1.EndpointPort
		cfg   kube.Config
		want  [3]int
	}{
		{"http and kv-events named, replay from config", []discoveryv1.EndpointPort{port("http", 8001), port("kv-events", 5600)},
			kube.Config{ReplayPort: 5558}, [3]int{8001, 5600, 5558}},
		{"http and kv-events named, no replay", []discoveryv1.EndpointPort{port("kv-events", 5600), port("http", 8001)},
			kube.Config{}, [3]int{8001, 5600, 0}},
		{"one unnamed port is HTTP", []discoveryv1.EndpointPort{port("", 9000)},
			kube.Config{EventsPort: 5557, ReplayPort: 5558}, [3]int{9000, 5557, 5558}},
		{"no ports: the defaults", nil, kube.Config{EventsPort: 5557}, [3]int{8000, 5557, 0}},
		{"an unknown name only: HTTP from config", []discoveryv1.EndpointPort{port("grpc", 9001)},
			kube.Config{HTTPPort: 8100}, [3]int{8100, 0, 0}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client := fake.NewClientset(slice("s", "vllm", tc.ports, ep("vllm-0", "10.0.0.1", true, true, false)))
			cfg := tc.cfg
			cfg.Namespace, cfg.Service, cfg.Client = ns, "vllm", client
			w := start(t, cfg)
			w.until("initial sync", []discovery.Endpoint{{Name: "vllm-0", Host: "10.0.0.1",
				HTTPPort: tc.want[0], EventsPort: tc.want[1], ReplayPort: tc.want[2], Labels: zoneA}})
		})
	}
}

func TestServiceDualStackAndUnnamed(t *testing.T) {
	v6 := slice("s-v6", "vllm", []discoveryv1.EndpointPort{port("http", 8000)}, ep("vllm-0", "fd00::1", true, true, false))
	v6.AddressType = discoveryv1.AddressTypeIPv6
	bare := ep("", "10.0.0.7", true, true, false)
	bare.TargetRef, bare.Zone, bare.Conditions = nil, nil, discoveryv1.EndpointConditions{} // unknown conditions: ready
	v4 := slice("s-v4", "vllm", []discoveryv1.EndpointPort{port("http", 8000)}, ep("vllm-0", "10.0.0.1", true, true, false), bare)
	w := start(t, kube.Config{Namespace: ns, Service: "vllm", Client: fake.NewClientset(v6, v4)})
	w.until("one endpoint per pod, IPv4 first; an address without a pod named by itself", []discovery.Endpoint{
		{Name: "10.0.0.7", Host: "10.0.0.7", HTTPPort: 8000},
		{Name: "vllm-0", Host: "10.0.0.1", HTTPPort: 8000, Labels: zoneA},
	})
}

func pod(name, ip string, ready bool, lbl map[string]string) *corev1.Pod {
	st := corev1.ConditionFalse
	if ready {
		st = corev1.ConditionTrue
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: lbl},
		Spec: corev1.PodSpec{NodeName: "node-1", Containers: []corev1.Container{{Name: "vllm", Ports: []corev1.ContainerPort{
			{Name: "http", ContainerPort: 8000}, {Name: "kv-events", ContainerPort: 5557},
		}}}},
		Status: corev1.PodStatus{Phase: corev1.PodRunning, PodIP: ip,
			Conditions: []corev1.PodCondition{{Type: corev1.PodReady, Status: st}}},
	}
}

func TestSelectorLifecycle(t *testing.T) {
	ctx := context.Background()
	vllm := map[string]string{"app": "vllm"}
	client := fake.NewClientset(pod("vllm-0", "10.0.1.1", true, vllm), pod("web-0", "10.0.1.9", true, map[string]string{"app": "web"}))
	pods := client.CoreV1().Pods(ns)
	w := start(t, kube.Config{Namespace: ns, Selector: "app=vllm", ReplayPort: 5558, Client: client})
	node := map[string]string{"kubernetes.io/hostname": "node-1"}
	vllm0 := discovery.Endpoint{Name: "vllm-0", Host: "10.0.1.1", HTTPPort: 8000, EventsPort: 5557, ReplayPort: 5558, Labels: node}
	w.until("initial sync: the selected pod only", []discovery.Endpoint{vllm0})

	p1 := pod("vllm-1", "10.0.1.2", false, map[string]string{"app": "vllm", kube.ModelLabel: "qwen"})
	if _, err := pods.Create(ctx, p1, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	pending := pod("vllm-2", "", false, vllm) // not scheduled yet: no address
	if _, err := pods.Create(ctx, pending, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	p1.Status.Conditions[0].Status = corev1.ConditionTrue
	if _, err := pods.UpdateStatus(ctx, p1, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	vllm1 := discovery.Endpoint{Name: "vllm-1", Host: "10.0.1.2", HTTPPort: 8000, EventsPort: 5557, ReplayPort: 5558, Model: "qwen", Labels: node}
	w.until("a pod became ready", []discovery.Endpoint{vllm0, vllm1})

	t.Run("deleting is terminating", func(t *testing.T) {
		p0, err := pods.Get(ctx, "vllm-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p0.DeletionTimestamp = ptr(metav1.Now())
		p0.Status.Conditions[0].Status = corev1.ConditionFalse
		if _, err := pods.Update(ctx, p0, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		draining := vllm0
		draining.Terminating = true
		w.until("vllm-0 terminating", []discovery.Endpoint{draining, vllm1})
	})
	t.Run("deleted", func(t *testing.T) {
		if err := pods.Delete(ctx, "vllm-0", metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		w.until("vllm-0 deleted", []discovery.Endpoint{vllm1})
	})
	t.Run("finished", func(t *testing.T) {
		p1.Status.Phase = corev1.PodFailed
		if _, err := pods.UpdateStatus(ctx, p1, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
		w.until("vllm-1 failed", []discovery.Endpoint{})
	})
}

// TestListFails: an API server that refuses the list is asked again (the
// reflector's back-off), and nothing is reported meanwhile: no empty set
// that would look like a fleet gone.
func TestListFails(t *testing.T) {
	client := fake.NewClientset(pod("vllm-0", "10.0.1.1", true, map[string]string{"app": "vllm"}))
	lists := make(chan struct{}, 16)
	client.PrependReactor("list", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
		select {
		case lists <- struct{}{}:
		default:
		}
		return true, nil, errors.New("forbidden, say")
	})
	src, err := kube.New(kube.Config{Namespace: ns, Selector: "app=vllm", Client: client,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	reported := make(chan []discovery.Endpoint, 1)
	go func() {
		done <- src.Run(ctx, func(es []discovery.Endpoint) {
			select {
			case reported <- es:
			default:
			}
		})
	}()
	for i := range 2 {
		select {
		case <-lists:
		case err := <-done:
			t.Fatalf("Run returned %v before the list was retried", err)
		case <-time.After(bound):
			t.Fatalf("list %d not attempted within %v", i+1, bound)
		}
	}
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v, want context.Canceled", err)
		}
	case <-time.After(bound):
		t.Fatalf("Run did not return within %v of its context ending", bound)
	}
	select {
	case es := <-reported:
		t.Errorf("reported %+v while the list failed, want nothing", es)
	default:
	}
}

func TestNew(t *testing.T) {
	client := fake.NewClientset()
	for _, tc := range []struct {
		name     string
		cfg      kube.Config
		wantName string
		wantErr  bool
	}{
		{"service", kube.Config{Namespace: "ml", Service: "vllm"}, "k8s:ml/vllm", false},
		{"selector", kube.Config{Namespace: "ml", Selector: "app=vllm,tier!=canary"}, "k8s:ml/app=vllm,tier!=canary", false},
		{"no namespace", kube.Config{Service: "vllm"}, "", true},
		{"bad namespace", kube.Config{Namespace: "ML_", Service: "vllm"}, "", true},
		{"both", kube.Config{Namespace: "ml", Service: "vllm", Selector: "app=vllm"}, "", true},
		{"neither", kube.Config{Namespace: "ml"}, "", true},
		{"empty selector", kube.Config{Namespace: "ml", Selector: " "}, "", true},
		{"bad selector", kube.Config{Namespace: "ml", Selector: "app in ("}, "", true},
		{"bad service name", kube.Config{Namespace: "ml", Service: "Vllm.x"}, "", true},
		{"port out of range", kube.Config{Namespace: "ml", Service: "vllm", EventsPort: 70000}, "", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := tc.cfg
			cfg.Client = client
			src, err := kube.New(cfg)
			if tc.wantErr {
				if err == nil {
					t.Fatalf("New(%+v) = %s, want an error", tc.cfg, src.Name())
				}
				return
			}
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			if got := src.Name(); got != tc.wantName {
				t.Errorf("Name() = %q, want %q", got, tc.wantName)
			}
		})
	}
}

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		in, ns, name string
		wantErr      bool
	}{
		{"default/vllm", "default", "vllm", false},
		{"ml/app=vllm", "ml", "app=vllm", false},
		{"kvroute/app.kubernetes.io/name=vllm", "kvroute", "app.kubernetes.io/name=vllm", false},
		{"ml/app in (a/b)", "ml", "app in (a/b)", false},
		{"vllm", "", "", true},
		{"/vllm", "", "", true},
		{"ml/", "", "", true},
	} {
		t.Run(tc.in, func(t *testing.T) {
			ns, name, err := kube.ParseTarget(tc.in)
			if (err != nil) != tc.wantErr {
				t.Fatalf("ParseTarget(%q) error %v, want error %v", tc.in, err, tc.wantErr)
			}
			if ns != tc.ns || name != tc.name {
				t.Errorf("ParseTarget(%q) = %q, %q, want %q, %q", tc.in, ns, name, tc.ns, tc.name)
			}
		})
	}
}

// BenchmarkPodToReport measures how long a pod that becomes ready takes
// to reach the update callback through the informer (fake clientset: the
// API server's own latency is not in it, nor the fake's Create, which
// builds a REST mapper per call and costs milliseconds), one pod per
// iteration: watch event, cache, list, compare, report.
func BenchmarkPodToReport(b *testing.B) {
	ctx := context.Background()
	client := fake.NewClientset()
	pods := client.CoreV1().Pods(ns)
	w := start(b, kube.Config{Namespace: ns, Selector: "app=vllm", Client: client})
	w.next("initial sync")
	lbl := map[string]string{"app": "vllm"}
	b.ResetTimer()
	for i := range b.N {
		p := pod(fmt.Sprintf("vllm-%d", i), fmt.Sprintf("10.1.%d.%d", i/250, i%250+1), true, lbl)
		b.StopTimer()
		if _, err := pods.Create(ctx, p, metav1.CreateOptions{}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		for len(w.next("pod added")) != i+1 {
		}
	}
}
