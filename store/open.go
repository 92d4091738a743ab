package store

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/alicebob/miniredis/v2"
)

// Open connects to the one Redis server at rawURL (redis:// or rediss://):
// OpenConfig with Config{URL: rawURL}.
func Open(ctx context.Context, rawURL string, opt Options) (*Store, error) {
	return OpenConfig(ctx, Config{URL: rawURL}, opt)
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
