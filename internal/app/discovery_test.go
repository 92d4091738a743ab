package app_test

import (
	"context"
	"encoding/json"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"testing"

	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/discovery"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/vllmtest"
)

// oneEndpoint reports one endpoint and no change after.
type oneEndpoint struct{ ep discovery.Endpoint }

func (oneEndpoint) Name() string { return "static:test" }
func (s oneEndpoint) Run(ctx context.Context, update func([]discovery.Endpoint)) error {
	update([]discovery.Endpoint{s.ep})
	<-ctx.Done()
	return ctx.Err()
}

// TestServeEmbeddedDiscovers: serve without Redis runs the discovery task
// beside its embedded ingestor; the endpoint is registered with the model
// its /v1/models names, said discovered and serving, and routed to, beside
// a hand-registered replica that discovery leaves alone.
func TestServeEmbeddedDiscovers(t *testing.T) {
	rep, err := vllmtest.New(vllmtest.Config{Model: "m"})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = rep.Stop() })
	u, _ := url.Parse(rep.URL())
	host, port, _ := net.SplitHostPort(u.Host)
	p, _ := strconv.Atoi(port)
	ep := discovery.Endpoint{Name: "sim-0", Host: host, HTTPPort: p}
	base := startApp(t, app.Config{Tasks: []app.Task{app.Discover(app.DiscoverConfig{Sources: []discovery.Source{oneEndpoint{ep}}})}})
	if status, raw := call(t, http.MethodPut, base+"/v1/replicas/hand", `{"model":"m","url":"http://hand.invalid"}`); status != http.StatusCreated {
		t.Fatalf("register hand: %d %s", status, raw)
	}
	var list api.ReplicaList
	wait.Until(t, "sim-0 discovered", func() bool {
		_, raw := call(t, http.MethodGet, base+"/v1/replicas", "")
		list = api.ReplicaList{}
		_ = json.Unmarshal([]byte(raw), &list)
		return len(list.Replicas) == 2
	})
	for _, r := range list.Replicas {
		want := map[string][2]string{"hand": {"registered", "serving"}, "sim-0": {"static:test", "serving"}}[r.ID]
		if r.Source != want[0] || r.State != want[1] || r.Model != "m" {
			t.Errorf("%s: source %q state %q model %q, want %q %q m", r.ID, r.Source, r.State, r.Model, want[0], want[1])
		}
	}
	named := map[string]bool{}
	wait.Until(t, "decisions name both replicas", func() bool {
		named[route(t, base, seq(len(named)*100, 32)).Replica.ID] = true
		return named["sim-0"] && named["hand"]
	})
}
