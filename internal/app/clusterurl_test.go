package app_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/redistest"
)

// TestServeClusterURL: serve given go-redis's own cluster URL, the other
// seeds as addr options, runs on the Cluster, as with --redis-addrs.
func TestServeClusterURL(t *testing.T) {
	c := redistest.Cluster(t, 3)
	a := c.Addrs()
	base := startApp(t, app.Config{RedisURL: "redis://" + a[0] + "?addr=" + strings.Join(a[1:], "&addr=")})
	if status, raw := call(t, http.MethodPut, base+"/v1/replicas/r0", `{"model":"m","url":"http://r0.invalid:8000"}`); status != http.StatusCreated {
		t.Fatalf("PUT r0: %d %s", status, raw)
	}
	d := route(t, base, seq(0, 40))
	if d.Replica.ID != "r0" || d.Degraded {
		t.Errorf("decision %+v, want r0 from the store, not degraded", d)
	}
}
