package redistest_test

import (
	"context"
	"testing"

	"github.com/kvroute/kvroute/internal/redistest"
	"github.com/redis/go-redis/v9"
)

func TestBackends(t *testing.T) {
	for _, tc := range []struct {
		name string
		url  func(testing.TB) string
	}{
		{"miniredis", redistest.Miniredis},
		{"redis-server", redistest.Server},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := redis.ParseURL(tc.url(t))
			if err != nil {
				t.Fatal(err)
			}
			c := redis.NewClient(o)
			defer c.Close()
			ctx := context.Background()
			if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
				t.Fatalf("set: %v", err)
			}
			if got, err := c.Get(ctx, "k").Result(); err != nil || got != "v" {
				t.Fatalf("get = %q, %v; want %q", got, err, "v")
			}
		})
	}
}
