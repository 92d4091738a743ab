package router_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/router"
)

// TestRouteRefuses: the router is the one place a request's model and
// policy are validated, and its errors are typed, so that the API can map
// them to statuses and name the field at fault.
func TestRouteRefuses(t *testing.T) {
	ctx := context.Background()
	mem := mock.NewMemory(fleet(2, true)...)
	r := newRouter(t, mem.Index(), mem.Registry(), time.Now)
	for _, tt := range []struct {
		name  string
		req   router.Request
		field string
	}{
		{"no model", router.Request{Policy: "fastest"}, "model"},
		{"unknown policy", router.Request{Model: "m", Policy: "fastest"}, "policy"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := r.Route(ctx, tt.req)
			var re *router.RequestError
			if !errors.As(err, &re) || re.Field != tt.field || !errors.Is(err, kvroute.ErrInvalidInput) {
				t.Fatalf("got %v, want a *router.RequestError naming %s", err, tt.field)
			}
			if got := tt.req.Check(); got == nil || got.Error() != err.Error() {
				t.Errorf("Check() = %v, want what Route answered (%v)", got, err)
			}
		})
	}
	t.Run("unknown model", func(t *testing.T) {
		_, err := r.Route(ctx, router.Request{Model: "other", Tokens: []uint32{1}})
		var mnf *router.ModelNotFoundError
		if !errors.As(err, &mnf) || mnf.Model != "other" || !errors.Is(err, kvroute.ErrNotFound) {
			t.Fatalf("got %v, want a *router.ModelNotFoundError for other", err)
		}
		if got, want := err.Error(), `router: model "other": not found`; got != want {
			t.Errorf("got message %q, want %q", got, want)
		}
	})
	t.Run("valid", func(t *testing.T) {
		if err := (router.Request{Model: "m", Policy: "least-load"}).Check(); err != nil {
			t.Errorf("Check() = %v, want nil", err)
		}
	})
}
