package kvroute_test

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute"
)

func TestEngines(t *testing.T) {
	r := kvroute.Replica{ID: "dp", Model: "m", URL: "http://127.0.0.1:8000",
		Events: "tcp://127.0.0.1:5557", Replay: "tcp://127.0.0.1:5558", DataParallelSize: 3}
	t.Run("expanded by rank", func(t *testing.T) {
		es := r.Engines()
		if len(es) != 3 {
			t.Fatalf("got %d engines, want 3", len(es))
		}
		for rank, e := range es {
			got, ok := e.Rank()
			switch {
			case !ok || got != rank:
				t.Errorf("engine %d: rank %d, %v", rank, got, ok)
			case e.ID != kvroute.EngineID("dp", rank) || kvroute.ServerID(e.ID) != "dp":
				t.Errorf("engine %d: id %q", rank, e.ID)
			case e.URL != r.URL || e.DataParallelSize != 0:
				t.Errorf("engine %d: %+v, want the server's URL and one engine", rank, e)
			}
		}
		if es[2].Events != "tcp://127.0.0.1:5559" || es[2].Replay != "tcp://127.0.0.1:5560" {
			t.Errorf("rank 2 endpoints %q %q, want the ports offset by 2", es[2].Events, es[2].Replay)
		}
	})
	t.Run("one engine stays itself", func(t *testing.T) {
		one := r
		one.DataParallelSize = 1
		if es := one.Engines(); len(es) != 1 || es[0].ID != "dp" {
			t.Errorf("got %+v, want the replica itself", es)
		}
		if _, ok := one.Rank(); ok {
			t.Errorf("a registered replica has no rank")
		}
	})
	t.Run("an engine id never names a registered replica", func(t *testing.T) {
		e := r.Engines()[1]
		if err := e.Validate(); err == nil {
			t.Errorf("engine id %q validated as a replica id", e.ID)
		}
		for _, id := range []string{"dp", "a/b", "a/-1", "a/64"} {
			if _, _, ok := kvroute.SplitEngineID(id); ok {
				t.Errorf("SplitEngineID(%q) ok, want not an engine id", id)
			}
		}
	})
	t.Run("ports that cannot be offset are refused", func(t *testing.T) {
		bad := r
		bad.Events, bad.DataParallelSize = "tcp://127.0.0.1:65534", 4
		var fe *kvroute.FieldError
		if err := bad.Validate(); !errors.As(err, &fe) || fe.Field != "events" {
			t.Errorf("got %v, want an events field error", err)
		}
	})
}
