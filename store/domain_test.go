package store_test

import (
	"testing"

	"github.com/kvroute/kvroute/store"
)

// TestFailureDomain: one server is one domain (whatever fails, everything
// does), and a request id names its model for the router's back-off.
// The Cluster case, slots as CLUSTER KEYSLOT gives them, is in
// TestClusterStore.
func TestFailureDomain(t *testing.T) {
	forBackends(t, func(t *testing.T, e *env) {
		one := e.s.FailureDomain("")
		for _, m := range []string{"a", "b", "some/model"} {
			if got := e.s.FailureDomain(m); got != one {
				t.Errorf("FailureDomain(%q) = %q, want %q, the one server's", m, got, one)
			}
		}
		if m, ok := e.s.RequestModel(store.RequestID("some/model", "x")); !ok || m != "some/model" {
			t.Errorf("RequestModel = %q, %v; want some/model", m, ok)
		}
		if _, ok := e.s.RequestModel("0123456789abcdef"); ok {
			t.Errorf("RequestModel of an id without a model: ok, want not")
		}
	})
}
