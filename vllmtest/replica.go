// Package vllmtest is a simulated vLLM server, for kvroute's demo mode, its
// tests and its benchmarks; in the spirit of net/http/httptest and
// internal/redistest, it starts a real server on loopback ports so that the
// code under test talks to it as it would to the real thing.
//
// A Replica serves vLLM's HTTP surface (completions, chat, their render
// endpoints, /tokenize, /health, /metrics), keeps a bounded LRU prefix cache keyed by vLLM's own
// sha256_cbor block hashes, and publishes vLLM's KV-cache events on a
// ZeroMQ PUB socket with a ROUTER replay socket beside it, byte for byte in
// the layouts documented in shared/VLLM_EVENTS.md.
//
// The cache never uses kvroute's block keys: the router must learn what a
// replica holds from the events alone, as it would from a real engine.
//
// Fault knobs (DropNext, Stall, Restart, ClearCache, SetHealthy, Die) let
// tests produce the sequence gaps, restarts and outages the router must
// survive.
package vllmtest

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// Config configures a Replica. Model is required; every other field has a
// default, given in its comment, that makes a small, fast replica on free
// loopback ports.
type Config struct {
	// Model is the served model name, reported in /metrics and responses
	// and required in requests (an empty request model means this one).
	// Required.
	Model string
	// LoRAs lists adapter names a request may name as its model. The adapter
	// goes into every block's extra keys and into the events, as in vLLM;
	// its lora_id is its index here plus one. Nil means no adapters.
	LoRAs []string
	// Tokenizer tokenizes text prompts and rendered chats, in generation,
	// the render endpoints and /tokenize, so that a replica can cache the
	// very ids a real vLLM serving that model caches (the demo uses
	// Qwen3's). Nil means the built-in byte tokenizer (one token per byte,
	// BOS 1; see tokenizer.go), whose counts the tests reason about.
	Tokenizer Encoder
	// ChatTemplate renders chat requests (messages, tools, documents,
	// chat_template_kwargs, add_generation_prompt,
	// continue_final_message) to the text Tokenizer encodes, as vLLM
	// applies the model's chat template; a template.RequestError is
	// answered with 400 and its message, as vLLM answers it. Nil means the
	// built-in toy ChatML-like format (renderChat in tokenizer.go).
	ChatTemplate ChatRenderer
	// BlockSize is the number of tokens per KV block. Zero means 16, vLLM's
	// default.
	BlockSize int
	// CapacityBlocks bounds the prefix cache, so that tests can force
	// evictions. Zero means 4096 blocks.
	CapacityBlocks int
	// MaxModelLen is the longest prompt accepted. Zero means 32768 tokens.
	MaxModelLen int
	// MaxRunning bounds concurrently running requests, as vllm serve's
	// --max-num-seqs does; others wait and are counted in
	// vllm:num_requests_waiting, so that tests can build a queue. Zero
	// means unbounded.
	MaxRunning int
	// SchedulingPolicy orders the waiting requests, as vllm serve's
	// --scheduling-policy: PolicyFCFS runs them in arrival order and
	// refuses a request whose priority field is not 0 (400, vLLM's
	// message); PolicyPriority runs them in (priority, arrival) order,
	// lowest first. Empty means PolicyFCFS, vLLM's default.
	SchedulingPolicy string
	// PrefillTokensPerSec and DecodeTokensPerSec set the simulated speed:
	// a request sleeps uncached_tokens/PrefillTokensPerSec before its first
	// token and 1/DecodeTokensPerSec per token, so that a cache hit is
	// visibly faster. Zero means instantaneous.
	PrefillTokensPerSec float64
	DecodeTokensPerSec  float64
	// EventEncoding is the event layout published: EncodingArray or
	// EncodingMap, since decoders must accept both. Empty means
	// EncodingArray.
	EventEncoding string
	// Topic is the first frame of every event message; it names the
	// replica when many publish to one bound SUB. Empty is vLLM's default.
	Topic string
	// HashSeed is hashed into NONE_HASH, as PYTHONHASHSEED is in vLLM
	// ("0" corresponds to PYTHONHASHSEED=0). Empty means DefaultHashSeed.
	HashSeed string
	// ReplayBuffer is how many batches the replay socket keeps; it also
	// bounds batches queued during a Stall. Zero means 10000, vLLM's
	// buffer_steps.
	ReplayBuffer int
	// ReplayWithoutTopic answers replay requests in the layout of vLLM
	// before PR #45177: ["", seq, payload] and end marker ["", 0xff..ff,
	// ""], since decoders must accept both. False means the current layout
	// with the topic.
	ReplayWithoutTopic bool
	// HTTPAddr, EventsEndpoint and ReplayEndpoint say where Start listens.
	// Empty means 127.0.0.1:0, tcp://127.0.0.1:0 and tcp://127.0.0.1:0:
	// free loopback ports, so that parallel tests never collide.
	HTTPAddr       string
	EventsEndpoint string
	ReplayEndpoint string
	// ConnectEvents, when set, makes the PUB socket dial this endpoint
	// instead of binding EventsEndpoint, as vLLM does for an endpoint
	// without "*": the router binds one SUB and every replica connects,
	// telling itself apart by Topic. Empty means bind.
	ConnectEvents string
	// DataParallelRank is the engine's data-parallel rank, sent in every
	// batch (data_parallel_rank) and as the engine label of its metrics,
	// as vLLM's engine r of a --data-parallel-size deployment does (see
	// DataParallel). Zero is vLLM's single engine.
	DataParallelRank int
	// Logger receives operational logs. A nil Logger discards
	// (slog.New(slog.DiscardHandler)), as in every kvroute package.
	Logger *slog.Logger
	// Now stamps batches and responses, so that tests can fix event
	// times. Nil means time.Now. Sleeps and stalls use real time so that a
	// frozen clock cannot hang a test.
	Now func() time.Time
}

func (c *Config) setDefaults() error {
	if c.Model == "" {
		return errors.New("model is required")
	}
	if c.BlockSize == 0 {
		c.BlockSize = 16
	}
	if c.CapacityBlocks == 0 {
		c.CapacityBlocks = 4096
	}
	if c.MaxModelLen == 0 {
		c.MaxModelLen = 32768
	}
	if c.HashSeed == "" {
		c.HashSeed = DefaultHashSeed
	}
	if c.ReplayBuffer == 0 {
		c.ReplayBuffer = 10000
	}
	if c.EventEncoding == "" {
		c.EventEncoding = EncodingArray
	}
	if c.HTTPAddr == "" {
		c.HTTPAddr = "127.0.0.1:0"
	}
	if c.EventsEndpoint == "" {
		c.EventsEndpoint = "tcp://127.0.0.1:0"
	}
	if c.ReplayEndpoint == "" {
		c.ReplayEndpoint = "tcp://127.0.0.1:0"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.SchedulingPolicy == "" {
		c.SchedulingPolicy = PolicyFCFS
	}
	switch {
	case c.BlockSize < 0, c.CapacityBlocks < 0, c.MaxModelLen < 0, c.MaxRunning < 0, c.ReplayBuffer < 0:
		return errors.New("sizes must not be negative")
	case c.PrefillTokensPerSec < 0, c.DecodeTokensPerSec < 0:
		return errors.New("speeds must not be negative")
	case c.EventEncoding != EncodingArray && c.EventEncoding != EncodingMap:
		return fmt.Errorf("unknown event encoding %q", c.EventEncoding)
	case c.SchedulingPolicy != PolicyFCFS && c.SchedulingPolicy != PolicyPriority:
		return fmt.Errorf("unknown scheduling policy %q (want fcfs or priority)", c.SchedulingPolicy)
	}
	return nil
}

// Replica is one simulated vLLM server. Its methods are safe for concurrent
// use.
type Replica struct {
	cfg    Config
	log    *slog.Logger
	hasher *hasher

	// mu guards the cache, the sequence counter, the replay buffer and the
	// publish queue together: a batch's seq, its place in the replay buffer
	// and its place on the wire follow the order the cache changed in.
	mu         sync.Mutex
	cache      *blockLRU
	seq        uint64
	replay     []batch
	pending    []batch // waiting for the publisher goroutine
	dropNext   int
	stallUntil time.Time
	healthy    bool
	queries    uint64 // prompt tokens looked up, vllm:prefix_cache_queries_total
	hits       uint64 // prompt tokens served from cache
	running    int
	waiting    int
	reqID      uint64
	// hang, when not nil, holds generation requests until closed;
	// dieAfter is the events a response gets before its connection is
	// cut (-1: none). See faults.go.
	hang     chan struct{}
	dieAfter int

	queue    []*waiter // requests waiting for a running slot
	arrivals uint64    // the waiting queue's arrival counter

	notify chan struct{} // wakes the publisher, capacity 1

	// Set by Start.
	started  bool
	stopped  bool
	cancel   context.CancelFunc
	done     chan struct{} // closed when background goroutines have exited
	pub      zmq4.Socket
	router   zmq4.Socket
	httpLn   net.Listener
	server   *http.Server
	url      string
	eventsEP string
	replayEP string
	wg       sync.WaitGroup
}

// New validates cfg and returns a stopped Replica.
func New(cfg Config) (*Replica, error) {
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("replica: %w", err)
	}
	h, err := newHasher(cfg.HashSeed)
	if err != nil {
		return nil, fmt.Errorf("replica: %w", err)
	}
	r := &Replica{
		cfg:      cfg,
		log:      cfg.Logger.With("replica", cfg.Model),
		hasher:   h,
		cache:    newLRU(cfg.CapacityBlocks),
		healthy:  true,
		notify:   make(chan struct{}, 1),
		dieAfter: -1,
		done:     make(chan struct{}),
	}
	return r, nil
}

// Start binds the HTTP listener, the PUB socket and the replay ROUTER and
// serves until Stop, Die, or the cancellation of ctx.
func (r *Replica) Start(ctx context.Context) (err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.started {
		return errors.New("replica: already started")
	}
	r.started = true

	zctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	r.cancel = cancel
	defer func() {
		if err != nil {
			r.closeAll(false)
			close(r.done)
		}
	}()
	zlog := slog.NewLogLogger(r.log.Handler(), slog.LevelDebug)

	r.pub = zmq4.NewPub(zctx, zmq4.WithLogger(zlog))
	if r.cfg.ConnectEvents != "" {
		if err := r.pub.Dial(r.cfg.ConnectEvents); err != nil {
			return fmt.Errorf("replica: events dial: %w", err)
		}
		r.eventsEP = r.cfg.ConnectEvents
	} else {
		if err := r.pub.Listen(r.cfg.EventsEndpoint); err != nil {
			return fmt.Errorf("replica: events listen: %w", err)
		}
		r.eventsEP = dialable(r.cfg.EventsEndpoint, r.pub.Addr())
	}

	r.router = zmq4.NewRouter(zctx, zmq4.WithLogger(zlog))
	if err := r.router.Listen(r.cfg.ReplayEndpoint); err != nil {
		return fmt.Errorf("replica: replay listen: %w", err)
	}
	r.replayEP = dialable(r.cfg.ReplayEndpoint, r.router.Addr())

	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", r.cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("replica: http listen: %w", err)
	}
	r.httpLn = ln
	r.url = "http://" + ln.Addr().String()
	r.server = &http.Server{
		Handler:           r.handler(),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return zctx },
		ErrorLog:          zlog,
	}

	r.wg.Add(3)
	go func() {
		defer r.wg.Done()
		if err := r.server.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			r.log.Error("http serve", "err", err)
		}
	}()
	go func() { defer r.wg.Done(); r.publishLoop(zctx) }()
	go func() { defer r.wg.Done(); r.replayLoop(zctx) }()
	go func() {
		r.wg.Wait()
		close(r.done)
	}()
	// The caller's ctx ends the replica like Stop does.
	context.AfterFunc(ctx, func() { _ = r.Stop() })

	r.log.Info("replica started", "url", r.url, "events", r.eventsEP, "replay", r.replayEP)
	return nil
}

// Stop shuts the replica down gracefully: in-flight HTTP requests get a
// moment to finish, then every socket closes. It is idempotent.
func (r *Replica) Stop() error {
	return r.stop(true)
}

// Die stops everything at once, like a killed process: open HTTP
// connections are cut and batches not yet published are lost.
func (r *Replica) Die() {
	_ = r.stop(false)
}

func (r *Replica) stop(graceful bool) error {
	r.mu.Lock()
	if !r.started || r.stopped {
		r.mu.Unlock()
		return nil
	}
	r.stopped = true
	r.mu.Unlock()
	// Held requests go at once, not after the graceful drain's wait.
	r.HangBeforeHeaders(false)

	err := r.closeAll(graceful)
	select {
	case <-r.done:
	case <-time.After(5 * time.Second):
		return errors.New("replica: stop: goroutines did not exit")
	}
	return err
}

// closeAll tears down what Start built; it tolerates a partial Start.
func (r *Replica) closeAll(graceful bool) error {
	var errs []error
	if r.server != nil {
		if graceful {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			if err := r.server.Shutdown(ctx); err != nil {
				_ = r.server.Close()
			}
			cancel()
		} else {
			_ = r.server.Close()
		}
	} else if r.httpLn != nil {
		_ = r.httpLn.Close()
	}
	if r.cancel != nil {
		r.cancel()
	}
	if r.pub != nil {
		if err := r.pub.Close(); err != nil && !isClosedErr(err) {
			errs = append(errs, fmt.Errorf("close pub: %w", err))
		}
	}
	if r.router != nil {
		if err := r.router.Close(); err != nil && !isClosedErr(err) {
			errs = append(errs, fmt.Errorf("close router: %w", err))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("replica: %w", err)
	}
	return nil
}

// dialable turns a bound address into an endpoint a peer on this host can
// dial: a wildcard bind (tcp://*:5557) is reached on loopback, and a port 0
// bind is reported with the port the kernel chose.
func dialable(endpoint string, addr net.Addr) string {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return endpoint
	}
	ip := ta.IP
	if ip == nil || ip.IsUnspecified() {
		ip = net.IPv4(127, 0, 0, 1)
	}
	return "tcp://" + net.JoinHostPort(ip.String(), strconv.Itoa(ta.Port))
}

func isClosedErr(err error) bool {
	return errors.Is(err, net.ErrClosed) || strings.Contains(err.Error(), "use of closed")
}

// URL is the base URL of the HTTP server (http://127.0.0.1:port).
func (r *Replica) URL() string { r.mu.Lock(); defer r.mu.Unlock(); return r.url }

// EventsEndpoint is the tcp:// address of the PUB socket, for a SUB to dial.
func (r *Replica) EventsEndpoint() string { r.mu.Lock(); defer r.mu.Unlock(); return r.eventsEP }

// ReplayEndpoint is the tcp:// address of the replay ROUTER socket.
func (r *Replica) ReplayEndpoint() string { r.mu.Lock(); defer r.mu.Unlock(); return r.replayEP }

// Topic is the topic frame of every event message.
func (r *Replica) Topic() string { return r.cfg.Topic }

// BlockSize is the number of tokens per block.
func (r *Replica) BlockSize() int { return r.cfg.BlockSize }

// WaitSubscribed blocks until some SUB socket has a subscription matching
// this replica's topic, so that a test can avoid ZeroMQ's slow-joiner loss
// without sleeping blindly.
func (r *Replica) WaitSubscribed(ctx context.Context) error {
	t := time.NewTicker(2 * time.Millisecond)
	defer t.Stop()
	for {
		r.mu.Lock()
		pub := r.pub
		r.mu.Unlock()
		if pub != nil {
			if tp, ok := pub.(zmq4.Topics); ok {
				for _, s := range tp.Topics() {
					if strings.HasPrefix(r.cfg.Topic, s) {
						return nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("replica: wait subscribed: %w", ctx.Err())
		case <-t.C:
		}
	}
}
