package store_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

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

// closedPort is a loopback address nothing listens on: it refuses.
func closedPort(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		tb.Fatal(err)
	}
	return addr
}

// TestGoRedisLog: go-redis's own pool lines (a dial failure per command
// while Redis refuses) reach the store's slog logger, the first at once
// and then one per interval with the count held back. go-redis has one
// logger per process, so lines that reach the handler are lines its
// default stderr logger no longer prints.
func TestGoRedisLog(t *testing.T) {
	addr := closedPort(t)
	h := &records{}
	var mu sync.Mutex
	// Far from the real clock, so that earlier tests' lines are long past.
	now := time.Now().Add(24 * time.Hour)
	clock := func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		return now
	}
	opt := store.Options{Logger: slog.New(h), Now: clock}
	refused := func(t *testing.T) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if s, err := store.OpenConfig(ctx, store.Config{URL: "redis://" + addr}, opt); err == nil {
			_ = s.Close()
			t.Fatalf("open %s: no error from a closed port", addr)
		}
	}
	t.Run("the first dial failure is logged", func(t *testing.T) {
		refused(t)
		if got := h.dialFailures(t); len(got) != 1 || got[0] != 0 {
			t.Fatalf("dial-failure lines (suppressed counts) = %v, want [0]", got)
		}
	})
	const more = 20
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
