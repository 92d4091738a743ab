package vllmtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// HeaderDataParallelRank is the request header vLLM routes a request to a
// data-parallel engine by.
const HeaderDataParallelRank = "X-data-parallel-rank"

// DataParallel is a simulated `vllm serve --data-parallel-size N`: N
// engines, each a Replica with its own prefix cache and its own event and
// replay sockets at the configured ports offset by its rank, behind one
// HTTP port. A request goes to the rank its X-data-parallel-rank header
// names, or round-robin when it names none (or IgnoreRank is set, as a
// vLLM without the header, or a server that balances on its own, does);
// /metrics labels each engine's series engine="<rank>". Its methods are
// safe for concurrent use.
type DataParallel struct {
	cfg        Config
	ignoreRank bool
	engines    []*Replica
	handlers   []http.Handler
	next       atomic.Uint64

	mu     sync.Mutex
	server *http.Server
	url    string
}

// NewDataParallel validates cfg (one engine's configuration: its
// EventsEndpoint and ReplayEndpoint are rank 0's, HTTPAddr the shared
// port) and returns size stopped engines.
func NewDataParallel(cfg Config, size int, ignoreRank bool) (*DataParallel, error) {
	if size < 1 {
		return nil, fmt.Errorf("data parallel: size %d must be at least 1", size)
	}
	if cfg.ConnectEvents != "" {
		return nil, errors.New("data parallel: engines bind their event sockets")
	}
	if err := cfg.setDefaults(); err != nil {
		return nil, fmt.Errorf("data parallel: %w", err)
	}
	return &DataParallel{cfg: cfg, ignoreRank: ignoreRank, engines: make([]*Replica, size)}, nil
}

// Start binds every engine's sockets and the shared HTTP port. Engines
// configured on port 0 get consecutive free ports (rank 0's chosen by the
// kernel), retried a few times when another process holds one of them.
func (d *DataParallel) Start(ctx context.Context) error {
	var err error
	for range 20 {
		if err = d.startEngines(ctx); err == nil {
			break
		}
	}
	if err != nil {
		return err
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "tcp", d.cfg.HTTPAddr)
	if err != nil {
		d.stopEngines()
		return fmt.Errorf("data parallel: http listen: %w", err)
	}
	d.mu.Lock()
	d.url = "http://" + ln.Addr().String()
	d.server = &http.Server{Handler: d.handler(), ReadHeaderTimeout: 10 * time.Second}
	srv := d.server
	d.mu.Unlock()
	go func() { _ = srv.Serve(ln) }()
	context.AfterFunc(ctx, func() { _ = d.Stop() })
	return nil
}

// startEngines starts every engine, or none.
func (d *DataParallel) startEngines(ctx context.Context) error {
	d.handlers = make([]http.Handler, len(d.engines))
	var events, replay int
	for rank := range d.engines {
		c := d.cfg
		c.DataParallelRank, c.HTTPAddr = rank, "127.0.0.1:0"
		if rank > 0 {
			c.EventsEndpoint = rankEndpoint(d.cfg.EventsEndpoint, events, rank)
			c.ReplayEndpoint = rankEndpoint(d.cfg.ReplayEndpoint, replay, rank)
		}
		e, err := New(c)
		if err == nil {
			err = e.Start(ctx)
		}
		if err != nil {
			d.stopEngines()
			return fmt.Errorf("data parallel: engine %d: %w", rank, err)
		}
		if rank == 0 {
			events, replay = endpointPort(e.EventsEndpoint()), endpointPort(e.ReplayEndpoint())
		}
		d.engines[rank], d.handlers[rank] = e, e.handler()
	}
	return nil
}

// rankEndpoint is rank's endpoint: the configured one with its port (or,
// for port 0, the port rank 0 was given) offset by rank.
func rankEndpoint(configured string, rank0Port, rank int) string {
	i := strings.LastIndexByte(configured, ':')
	port, _ := strconv.Atoi(configured[i+1:])
	if port == 0 {
		port = rank0Port
	}
	return configured[:i+1] + strconv.Itoa(port+rank)
}

func endpointPort(ep string) int {
	p, _ := strconv.Atoi(ep[strings.LastIndexByte(ep, ':')+1:])
	return p
}

func (d *DataParallel) stopEngines() {
	for i, e := range d.engines {
		if e != nil {
			_ = e.Stop()
			d.engines[i] = nil
		}
	}
}

// Stop shuts the HTTP port and every engine down; it is idempotent.
func (d *DataParallel) Stop() error {
	d.mu.Lock()
	srv := d.server
	d.server = nil
	d.mu.Unlock()
	if srv == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		_ = srv.Close()
	}
	var errs []error
	for _, e := range d.engines {
		errs = append(errs, e.Stop())
	}
	return errors.Join(errs...)
}

// URL is the shared HTTP base URL.
func (d *DataParallel) URL() string { d.mu.Lock(); defer d.mu.Unlock(); return d.url }

// Size is the number of engines.
func (d *DataParallel) Size() int { return len(d.engines) }

// Engine is rank's engine, for its cache and fault knobs.
func (d *DataParallel) Engine(rank int) *Replica { return d.engines[rank] }

// EventsEndpoint and ReplayEndpoint are rank 0's; rank r's ports are r
// more.
func (d *DataParallel) EventsEndpoint() string { return d.engines[0].EventsEndpoint() }
func (d *DataParallel) ReplayEndpoint() string { return d.engines[0].ReplayEndpoint() }

func (d *DataParallel) handler() http.Handler {
	mux := http.NewServeMux()
	gen := func(w http.ResponseWriter, req *http.Request) { d.handlers[d.rankOf(req)].ServeHTTP(w, req) }
	mux.HandleFunc("POST /v1/completions", gen)
	mux.HandleFunc("POST /v1/chat/completions", gen)
	mux.HandleFunc("GET /metrics", d.serveMetrics)
	mux.Handle("/", d.handlers[0]) // render, tokenize, health, models: any engine answers alike
	return mux
}

// rankOf is the engine a request goes to: its header's, or the next in
// turn.
func (d *DataParallel) rankOf(req *http.Request) int {
	if !d.ignoreRank {
		if r, err := strconv.Atoi(req.Header.Get(HeaderDataParallelRank)); err == nil && r >= 0 && r < len(d.engines) {
			return r
		}
	}
	return int((d.next.Add(1) - 1) % uint64(len(d.engines)))
}

// serveMetrics merges the engines' expositions, one family at a time as
// the text format wants it: its HELP and TYPE once, then every engine's
// samples.
func (d *DataParallel) serveMetrics(w http.ResponseWriter, req *http.Request) {
	var order []string
	headers, samples := map[string][]string{}, map[string][]string{}
	for _, h := range d.handlers {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		sc := bufio.NewScanner(bytes.NewReader(rec.Body.Bytes()))
		for sc.Scan() {
			line := sc.Text()
			name := line
			if f := strings.Fields(line); len(f) >= 3 && f[0] == "#" {
				name = f[2]
			} else if i := strings.IndexAny(line, "{ "); i >= 0 {
				name = line[:i]
			}
			if _, ok := samples[name]; !ok {
				order = append(order, name)
				samples[name] = nil
			}
			if strings.HasPrefix(line, "#") {
				if len(headers[name]) < 2 {
					headers[name] = append(headers[name], line)
				}
				continue
			}
			samples[name] = append(samples[name], line)
		}
	}
	var b strings.Builder
	for _, name := range order {
		for _, l := range append(headers[name], samples[name]...) {
			b.WriteString(l)
			b.WriteByte('\n')
		}
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}
