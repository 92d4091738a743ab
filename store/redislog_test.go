package store_test

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/kvroute/kvroute/store"
)

// records is a slog handler that keeps what it is given.
type records struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) WithAttrs([]slog.Attr) slog.Handler       { return r }
func (r *records) WithGroup(string) slog.Handler            { return r }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.recs = append(r.recs, rec.Clone())
	return nil
}

// dialFailures are the go-redis dial-failure lines logged so far, each
// with its suppressed count (0: none given).
func (r *records) dialFailures(tb testing.TB) []int64 {
	tb.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []int64
	for _, rec := range r.recs {
		if !strings.HasPrefix(rec.Message, "go-redis: ") {
			tb.Errorf("log line %q does not say it is go-redis's", rec.Message)
		}
		if !strings.Contains(rec.Message, "failed to dial") {
			continue
		}
		var held int64
		rec.Attrs(func(a slog.Attr) bool {
			if a.Key == "suppressed" {
				held = a.Value.Int64()
			}
			return true
		})
		out = append(out, held)
	}
	return out
}

// downable is a loopback forwarder to a real redis-server that can go
// down: down closes its listener and every connection through it, so
// that the address refuses from then on.
type downable struct {
	ln    net.Listener
	mu    sync.Mutex
	conns []net.Conn
	wg    sync.WaitGroup
}

func forward(tb testing.TB, target string) *downable {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	d := &downable{ln: ln}
	d.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			r, err := net.Dial("tcp", target)
			if err != nil {
				_ = c.Close()
				continue
			}
			d.mu.Lock()
			d.conns = append(d.conns, c, r)
			d.mu.Unlock()
			d.wg.Go(func() { _, _ = io.Copy(r, c); _ = r.Close() })
			d.wg.Go(func() { _, _ = io.Copy(c, r); _ = c.Close() })
		}
	})
	tb.Cleanup(d.down)
	return d
}

func (d *downable) addr() string { return d.ln.Addr().String() }

func (d *downable) down() {
	_ = d.ln.Close()
	d.mu.Lock()
	for _, c := range d.conns {
		_ = c.Close()
	}
	d.conns = nil
	d.mu.Unlock()
	d.wg.Wait()
}

// TestGoRedisLog: while Redis refuses, go-redis's pool writes a dial
// failure for every command; those lines reach the store's slog logger,
// the first at once and then one per interval with the count held back.
// go-redis has one logger per process, so lines that reach the handler
// are lines its default stderr logger no longer prints.
func TestGoRedisLog(t *testing.T) {
	u, err := url.Parse(redistest.Server(t))
	if err != nil {
		t.Fatal(err)
	}
	proxy := forward(t, u.Host)
	u.Host = proxy.addr()
	h := &records{}
	var mu sync.Mutex
	now := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	ctx := context.Background()
	s, err := store.OpenConfig(ctx, store.Config{URL: u.String()}, store.Options{Logger: slog.New(h), Now: clock})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	proxy.down()
	refused := func(t *testing.T) {
		t.Helper()
		if _, err := s.ListReplicas(ctx); err == nil {
			t.Fatal("list replicas: no error while Redis refuses")
		}
	}
	t.Run("the first dial failure is logged", func(t *testing.T) {
		refused(t)
		if got := h.dialFailures(t); len(got) != 1 || got[0] != 0 {
			t.Fatalf("dial-failure lines (suppressed counts) = %v, want [0]", got)
		}
	})
	const more = 5
	t.Run("repeats within the interval are held back", func(t *testing.T) {
		for range more {
			refused(t)
		}
		if got := h.dialFailures(t); len(got) != 1 {
			t.Fatalf("dial-failure lines = %v, want still 1 after %d more refusals", got, more)
		}
	})
	t.Run("after the interval one line counts the held ones", func(t *testing.T) {
		mu.Lock()
		now = now.Add(6 * time.Second)
		mu.Unlock()
		refused(t)
		got := h.dialFailures(t)
		if len(got) != 2 || got[1] < more {
			t.Fatalf("dial-failure lines (suppressed counts) = %v, want 2, the second counting at least %d", got, more)
		}
	})
}
