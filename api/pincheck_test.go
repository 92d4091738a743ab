package api_test

import (
	"context"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/api"
)

type pinRecorder struct {
	mu  sync.Mutex
	ids []string
}

func (p *pinRecorder) SetPinIgnored(_ context.Context, id string) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.ids = append(p.ids, id)
	return nil
}

func TestPinCheck(t *testing.T) {
	t.Run("a round-robin server is flagged within ten responses", func(t *testing.T) {
		c := api.NewPinCheck(nil, nil, nil, nil)
		n := 0
		for i := range 20 {
			cached := 0
			if i%4 == 0 {
				cached = 160 // a round-robin landed where the cache was
			}
			n++
			if c.Observe("dp", 160, cached) {
				break
			}
		}
		if n > 10 {
			t.Errorf("flagged after %d responses, want at most 10", n)
		}
	})
	t.Run("an honoured pin with some evictions is not", func(t *testing.T) {
		c := api.NewPinCheck(nil, nil, nil, nil)
		for i := range 1000 {
			cached := 160
			if i%10 == 0 {
				cached = 0
			}
			if c.Observe("dp", 160, cached) {
				t.Fatalf("flagged after %d responses", i+1)
			}
		}
	})
	t.Run("responses believed to miss say nothing", func(t *testing.T) {
		c := api.NewPinCheck(nil, nil, nil, nil)
		for i := range 100 {
			if c.Observe("dp", 0, 0) {
				t.Fatalf("flagged after %d responses believed cold", i+1)
			}
		}
	})
	t.Run("flagged once per replica", func(t *testing.T) {
		c := api.NewPinCheck(&pinRecorder{}, nil, nil, nil)
		flags := 0
		for range 50 {
			if c.Observe("dp", 16, 0) {
				flags++
			}
		}
		if flags != 1 {
			t.Errorf("flagged %d times, want once", flags)
		}
	})
}
