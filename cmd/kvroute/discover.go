package main

import (
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"time"

	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/discovery/dns"
	"github.com/kvroute/kvroute/discovery/kube"
	"github.com/kvroute/kvroute/internal/app"
)

// discoverFlags are the --discover-* flags `kvroute ingest` and `kvroute
// serve` (its embedded ingestor) share.
type discoverFlags struct {
	dnsNames                         stringList
	dnsServer                        string
	k8sServices, k8sSelectors        stringList
	kubeconfig                       string
	interval, grace                  time.Duration
	httpPort, eventsPort, replayPort int
}

func (d *discoverFlags) register(fs *flag.FlagSet) {
	fs.Var(&d.dnsNames, "discover-dns", "discover replicas from the A/AAAA records of `NAME` (a headless Service), or its SRV records when it starts with \"_\"; repeatable")
	fs.StringVar(&d.dnsServer, "discover-dns-server", "", "DNS resolver `host:port` --discover-dns asks (default: the system's)")
	fs.DurationVar(&d.interval, "discover-interval", 5*time.Second, "how often discovery re-resolves and reconciles the registry")
	fs.IntVar(&d.httpPort, "discover-http-port", 8000, "discovered replicas' HTTP `port` (A/AAAA records; SRV records carry their own)")
	fs.IntVar(&d.eventsPort, "discover-events-port", 5557, "discovered replicas' ZeroMQ KV-event `port` (0: none)")
	fs.IntVar(&d.replayPort, "discover-replay-port", 5558, "discovered replicas' ZeroMQ replay `port` (0: none)")
	fs.Var(&d.k8sServices, "discover-k8s-service", "discover replicas from the EndpointSlices of the Kubernetes Service `NAMESPACE/NAME` (ports named http, kv-events, kv-replay); repeatable")
	fs.Var(&d.k8sSelectors, "discover-k8s-selector", "discover replicas from the pods matching `NAMESPACE/SELECTOR` (e.g. default/app=vllm); repeatable")
	fs.StringVar(&d.kubeconfig, "kubeconfig", "", "kubeconfig `file` for the Kubernetes sources (default: the in-cluster service account)")
	fs.DurationVar(&d.grace, "discover-grace", 30*time.Second, "a discovered replica gone from its source is purged (index, load, bookings) after this")
}

// enabled reports whether any source was asked for.
func (d *discoverFlags) enabled() bool {
	return len(d.dnsNames)+len(d.k8sServices)+len(d.k8sSelectors) > 0
}

// config builds the sources the flags name. Every source kind is built
// here from its flags, into one list the reconciler follows.
func (d *discoverFlags) config(log *slog.Logger) (app.DiscoverConfig, error) {
	c := app.DiscoverConfig{Interval: d.interval, Grace: d.grace}
	if d.interval <= 0 || d.grace <= 0 {
		return c, errors.New("--discover-interval and --discover-grace must be positive")
	}
	var sources []discovery.Source
	for _, name := range d.dnsNames {
		s, err := dns.New(dns.Config{Name: name, Server: d.dnsServer, Interval: d.interval,
			HTTPPort: d.httpPort, EventsPort: d.eventsPort, ReplayPort: d.replayPort, Logger: log})
		if err != nil {
			return c, fmt.Errorf("--discover-dns: %w", err)
		}
		sources = append(sources, s)
	}
	for _, k := range []struct {
		flag    string
		targets stringList
		service bool
	}{{"--discover-k8s-service", d.k8sServices, true}, {"--discover-k8s-selector", d.k8sSelectors, false}} {
		for _, t := range k.targets {
			ns, name, err := kube.ParseTarget(t)
			if err != nil {
				return c, fmt.Errorf("%s: %w", k.flag, err)
			}
			kc := kube.Config{Namespace: ns, Kubeconfig: d.kubeconfig, HTTPPort: d.httpPort,
				EventsPort: d.eventsPort, ReplayPort: d.replayPort, Logger: log}
			if k.service {
				kc.Service = name
			} else {
				kc.Selector = name
			}
			s, err := kube.New(kc)
			if err != nil {
				return c, fmt.Errorf("%s: %w", k.flag, err)
			}
			sources = append(sources, s)
		}
	}
	c.Sources = sources
	return c, nil
}
