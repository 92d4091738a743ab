// Package kube is the Kubernetes discovery.Source: the EndpointSlices of a
// Service, or the pods a label selector matches, followed through
// client-go's informers (one list, then a watch), so that a pod an
// autoscaler adds or removes reaches the registry within one watch event
// rather than one polling interval.
package kube

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"time"

	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/kvroute/kvroute/discovery"
)

// vLLM's default HTTP port (vllm serve --port), used when neither the
// Config nor a named port gives one.
const defaultHTTPPort = 8000

// Config says what to watch and how to read its ports.
type Config struct {
	// Namespace holds the Service or the pods; required.
	Namespace string
	// Service is the Service whose EndpointSlices are followed (those
	// labelled kubernetes.io/service-name=Service). Exactly one of Service
	// and Selector is set.
	Service string
	// Selector is a label selector (app=vllm,tier!=canary) for the pods
	// followed.
	Selector string
	// Kubeconfig is the kubeconfig file used to build Client; empty: the
	// in-cluster configuration (the pod's service account).
	Kubeconfig string
	// HTTPPort, EventsPort and ReplayPort are the ports used when no port
	// is named "http", "kv-events" or "kv-replay" on the EndpointSlice or
	// the pod's containers. HTTPPort 0 is vLLM's 8000; EventsPort and
	// ReplayPort 0 mean none (the caller passes vLLM's 5557 and 5558 when
	// it wants them).
	HTTPPort, EventsPort, ReplayPort int
	// Resync is the informers' resync period, a safety net under the watch
	// (0: none; a resync that changes nothing is not reported).
	Resync time.Duration
	// Client talks to the API server; nil: built from Kubeconfig, or
	// in-cluster.
	Client kubernetes.Interface
	// Logger receives the source's log lines; nil: slog.Default().
	Logger *slog.Logger
}

// ParseTarget splits a "namespace/name" flag value (a Service, or a label
// selector) into its two parts. The first slash ends the namespace, so a
// selector keeps slashes of its own (kvroute/app.kubernetes.io/name=vllm).
func ParseTarget(s string) (namespace, name string, err error) {
	ns, rest, ok := strings.Cut(s, "/")
	switch {
	case !ok:
		return "", "", fmt.Errorf("kube target %q: want namespace/name", s)
	case len(validation.IsDNS1123Label(ns)) > 0:
		return "", "", fmt.Errorf("kube target %q: namespace %q is no DNS label", s, ns)
	case rest == "":
		return "", "", fmt.Errorf("kube target %q: empty name", s)
	}
	return ns, rest, nil
}

type source struct {
	cfg Config
	// selector picks the Service's EndpointSlices, or the pods; it both
	// narrows the watch on the API server and filters the cache's list.
	selector labels.Selector
	log      *slog.Logger
}

var _ discovery.Source = (*source)(nil)

// New checks cfg and builds the source; the API server is first asked in
// Run, so that a cluster that is down at start is retried rather than
// fatal.
func New(cfg Config) (discovery.Source, error) {
	if cfg.Namespace == "" {
		return nil, errors.New("kube source: namespace required")
	}
	if msgs := validation.IsDNS1123Label(cfg.Namespace); len(msgs) > 0 {
		return nil, fmt.Errorf("kube source: namespace %q: %s", cfg.Namespace, strings.Join(msgs, "; "))
	}
	if (cfg.Service == "") == (cfg.Selector == "") {
		return nil, errors.New("kube source: exactly one of service and selector required")
	}
	for name, p := range map[string]int{"http": cfg.HTTPPort, "events": cfg.EventsPort, "replay": cfg.ReplayPort} {
		if p < 0 || p > 65535 {
			return nil, fmt.Errorf("kube source: %s port %d out of range", name, p)
		}
	}
	if cfg.HTTPPort == 0 {
		cfg.HTTPPort = defaultHTTPPort
	}
	s := &source{cfg: cfg, log: cfg.Logger}
	if s.log == nil {
		s.log = slog.Default()
	}
	if cfg.Service != "" {
		if msgs := validation.IsDNS1035Label(cfg.Service); len(msgs) > 0 {
			return nil, fmt.Errorf("kube source: service %q: %s", cfg.Service, strings.Join(msgs, "; "))
		}
		s.selector = labels.SelectorFromSet(labels.Set{discoveryv1.LabelServiceName: cfg.Service})
	} else {
		sel, err := labels.Parse(cfg.Selector)
		if err != nil {
			return nil, fmt.Errorf("kube source: selector %q: %w", cfg.Selector, err)
		}
		if sel.Empty() {
			return nil, fmt.Errorf("kube source: selector %q matches every pod", cfg.Selector)
		}
		s.selector = sel
	}
	if cfg.Client == nil {
		c, err := newClient(cfg.Kubeconfig)
		if err != nil {
			return nil, err
		}
		s.cfg.Client = c
	}
	s.log = s.log.With("source", s.Name())
	return s, nil
}

func newClient(kubeconfig string) (kubernetes.Interface, error) {
	var rc *rest.Config
	var err error
	if kubeconfig != "" {
		rc, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
	} else {
		rc, err = rest.InClusterConfig()
	}
	if err != nil {
		return nil, fmt.Errorf("kube source: client config: %w", err)
	}
	c, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("kube source: client: %w", err)
	}
	return c, nil
}

// Name is "k8s:<namespace>/<service>" or "k8s:<namespace>/<selector>".
func (s *source) Name() string {
	if s.cfg.Service != "" {
		return "k8s:" + s.cfg.Namespace + "/" + s.cfg.Service
	}
	return "k8s:" + s.cfg.Namespace + "/" + s.cfg.Selector
}

// Run starts one informer, waits for its first list, reports the set, and
// reports it again after every change. Events only mark the set dirty (a
// channel of one): those that arrive while a set is listed or being
// reported fold into the next report, so a burst (a Deployment scaled by
// ten) costs as many reports as the consumer can take, not one per event;
// a set equal to the last one reported (a resync, a status change kvroute
// does not read) is not reported.
func (s *source) Run(ctx context.Context, update func([]discovery.Endpoint)) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	factory := informers.NewSharedInformerFactoryWithOptions(s.cfg.Client, s.cfg.Resync,
		informers.WithNamespace(s.cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = s.selector.String() }))
	var inf cache.SharedIndexInformer
	var list func() []discovery.Endpoint
	if s.cfg.Service != "" {
		l := factory.Discovery().V1().EndpointSlices()
		inf = l.Informer()
		list = func() []discovery.Endpoint {
			slices, err := l.Lister().EndpointSlices(s.cfg.Namespace).List(s.selector)
			if err != nil {
				s.log.Warn("list endpointslices", "err", err)
			}
			return sliceEndpoints(slices, s.cfg)
		}
	} else {
		l := factory.Core().V1().Pods()
		inf = l.Informer()
		list = func() []discovery.Endpoint {
			pods, err := l.Lister().Pods(s.cfg.Namespace).List(s.selector)
			if err != nil {
				s.log.Warn("list pods", "err", err)
			}
			return podEndpoints(pods, s.cfg)
		}
	}
	dirty := make(chan struct{}, 1)
	mark := func(any) {
		select {
		case dirty <- struct{}{}:
		default:
		}
	}
	if _, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    mark,
		UpdateFunc: func(_, n any) { mark(n) },
		DeleteFunc: mark,
	}); err != nil {
		return fmt.Errorf("kube source: event handler: %w", err)
	}
	if err := inf.SetWatchErrorHandlerWithContext(func(_ context.Context, _ *cache.Reflector, err error) {
		s.log.Warn("watch failed; retrying", "err", err)
	}); err != nil {
		return fmt.Errorf("kube source: watch error handler: %w", err)
	}
	factory.Start(ctx.Done())
	defer factory.Shutdown()
	if !cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
		return ctx.Err()
	}
	var last []discovery.Endpoint
	reported := false
	for {
		if set := list(); !reported || !reflect.DeepEqual(set, last) {
			update(set)
			last, reported = set, true
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-dirty:
		}
	}
}

// Port names that say which of a server's ports is which, on an
// EndpointSlice (from the Service's port names) or a container.
const (
	portHTTP   = "http"
	portEvents = "kv-events"
	portReplay = "kv-replay"
)

// ModelLabel, on a Service (copied to its EndpointSlices) or a pod, names
// the served model; without it the model is learned from /v1/models.
const ModelLabel = "kvroute.io/model"

// ports reads the named ports of one slice or pod: named ones win, a
// single unnamed port is HTTP, the rest come from cfg.
func ports(named map[string]int, unnamed []int, cfg Config) (httpPort, events, replay int) {
	httpPort, events, replay = cfg.HTTPPort, cfg.EventsPort, cfg.ReplayPort
	if p, ok := named[portHTTP]; ok {
		httpPort = p
	} else if len(unnamed) == 1 && len(named) == 0 {
		httpPort = unnamed[0]
	}
	if p, ok := named[portEvents]; ok {
		events = p
	}
	if p, ok := named[portReplay]; ok {
		replay = p
	}
	return httpPort, events, replay
}
