package store

import (
	"context"
	"fmt"
	"net/url"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Open connects to the Redis server at rawURL (redis:// or rediss://) with
// the client options every kvroute process uses (ClientOptions), and
// checks that it answers, so that a bad address fails at startup rather
// than on the first request.
func Open(ctx context.Context, rawURL string, opt Options) (*Store, error) {
	o, err := ClientOptions(rawURL)
	if err != nil {
		return nil, fmt.Errorf("store: open: %w", err)
	}
	s := New(redis.NewClient(o), opt)
	if err := s.c.Ping(ctx).Err(); err != nil {
		_ = s.Close()
		return nil, wrap("open "+o.Addr, err)
	}
	return s, nil
}

// ClientOptions parses a Redis URL into the client options of every
// kvroute process, scoring pods and ingestors alike, so that the two never
// run with different timeouts. Decisions sit on the request path, so
// unless the URL says otherwise a dead server is noticed in milliseconds
// (go-redis's own defaults are a 5 s dial, 3 s reads, 3 command retries and
// 5 dial retries: about 2 s per decision) and the router falls back to
// degraded mode. The URL's own query parameters (dial_timeout,
// read_timeout, write_timeout, max_retries, max_retry_backoff, pool_size,
// …) win.
func ClientOptions(rawURL string) (*redis.Options, error) {
	o, err := redis.ParseURL(rawURL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	u, err := url.Parse(rawURL)
	if err != nil {
		return nil, fmt.Errorf("redis url: %w", err)
	}
	q := u.Query()
	if !q.Has("dial_timeout") {
		o.DialTimeout = 300 * time.Millisecond
	}
	if !q.Has("read_timeout") {
		o.ReadTimeout = 500 * time.Millisecond
	}
	if !q.Has("write_timeout") {
		o.WriteTimeout = 500 * time.Millisecond
	}
	if !q.Has("max_retries") {
		// One retry rescues a pooled connection a Redis restart killed;
		// more only delay the fall-back.
		o.MaxRetries = 1
	}
	if !q.Has("max_retry_backoff") {
		o.MaxRetryBackoff = 20 * time.Millisecond
	}
	// go-redis also retries a refused dial five times 100 ms apart, on
	// every command: 0.8 s per decision during an outage.
	o.DialerRetries = 1
	o.DialerRetryTimeout = 10 * time.Millisecond
	return o, nil
}

// OpenEmbedded runs an in-memory Redis (miniredis) in this process and
// returns a Store over it: the zero-setup mode, in which nothing is shared
// with other processes and everything is lost on Close. Addr names the
// embedded server for logs.
func OpenEmbedded(ctx context.Context, opt Options) (_ *Store, addr string, _ error) {
	mini, err := miniredis.Run()
	if err != nil {
		return nil, "", fmt.Errorf("store: embedded redis: %w", err)
	}
	s, err := Open(ctx, "redis://"+mini.Addr(), opt)
	if err != nil {
		mini.Close()
		return nil, "", err
	}
	// miniredis only expires keys (approximate entries) when told that
	// time has passed.
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Go(func() {
		t := time.NewTicker(time.Second)
		defer t.Stop()
		last := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				mini.FastForward(now.Sub(last))
				last = now
			}
		}
	})
	var once sync.Once
	s.stop = func() {
		once.Do(func() {
			close(done)
			wg.Wait()
			mini.Close()
		})
	}
	return s, mini.Addr(), nil
}
