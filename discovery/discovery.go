// Package discovery keeps the registry in step with a fleet that changes:
// sources (DNS, Kubernetes) say which vLLM servers exist now, and the
// ingestors write what they find into the registry, where every pod reads
// it. A source only reports endpoints; what becomes of them (a replica's ID,
// its model, its lifecycle, its purge) is decided once, here, for every
// source alike.
package discovery

import "context"

// Endpoint is one vLLM server a source found.
type Endpoint struct {
	// Name is stable for as long as the source sees the endpoint (a pod's
	// name, an address and port); the replica's ID is derived from it.
	Name string
	// Host is the server's IP address or host name.
	Host string
	// HTTPPort serves the OpenAI API, /health and /metrics.
	HTTPPort int
	// EventsPort and ReplayPort are the ZeroMQ KV-event PUB and replay
	// ROUTER ports; 0 means the server publishes no events (it is routed on
	// approximate entries only) or keeps no replay buffer.
	EventsPort, ReplayPort int
	// Terminating says the server is draining: it takes no new requests,
	// and those in flight finish.
	Terminating bool
	// Model is the served model when the source knows it (a label); empty
	// means it is learned from the server's /v1/models.
	Model string
	// Labels are copied to the replica (the source's own metadata, such as
	// a pod's zone), for operators to read.
	Labels map[string]string
}

// A Source reports the complete set of endpoints it sees, every time that
// set changes.
type Source interface {
	// Name identifies the source in Replica.Source: "dns:<name>",
	// "k8s:<namespace>/<service>".
	Name() string
	// Run calls update with the complete current set of endpoints at least
	// once after it starts and again after every change, never
	// concurrently, until ctx ends; then it returns ctx's error. It returns
	// early only for an error no retry can mend (a malformed
	// configuration); a lookup that fails is retried, and keeps the last
	// set reported rather than reporting an empty one.
	Run(ctx context.Context, update func([]Endpoint)) error
}
