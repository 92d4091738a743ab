package kvroute_test

import (
	"errors"
	"testing"

	"github.com/kvroute/kvroute"
)

func TestReplicaValidate(t *testing.T) {
	ok := kvroute.Replica{ID: "r-1.a_b", Model: "m", URL: "http://127.0.0.1:8000"}
	tests := []struct {
		name  string
		edit  func(*kvroute.Replica)
		field string // "" means valid
	}{
		{"valid", func(*kvroute.Replica) {}, ""},
		{"reported block size", func(r *kvroute.Replica) { r.BlockSize = 16 }, ""},
		{"no id", func(r *kvroute.Replica) { r.ID = "" }, "id"},
		{"bad id", func(r *kvroute.Replica) { r.ID = "a/b" }, "id"},
		{"no model", func(r *kvroute.Replica) { r.Model = "" }, "model"},
		{"no url", func(r *kvroute.Replica) { r.URL = "" }, "url"},
		{"negative block size", func(r *kvroute.Replica) { r.BlockSize = -1 }, "block_size"},
		{"huge block size", func(r *kvroute.Replica) { r.BlockSize = kvroute.MaxBlockSize + 1 }, "block_size"},
		{"terminating", func(r *kvroute.Replica) { r.State = kvroute.StateTerminating }, ""},
		{"unknown state", func(r *kvroute.Replica) { r.State = "draining" }, "state"},
		{"discovered", func(r *kvroute.Replica) { r.Source = "dns:vllm.default.svc" }, ""},
		{"control character in source", func(r *kvroute.Replica) { r.Source = "dns:\x00" }, "source"},
		{"four ranks", func(r *kvroute.Replica) { r.DataParallelSize = 4 }, ""},
		{"negative ranks", func(r *kvroute.Replica) { r.DataParallelSize = -1 }, "data_parallel_size"},
		{"too many ranks", func(r *kvroute.Replica) { r.DataParallelSize = kvroute.MaxDataParallelSize + 1 }, "data_parallel_size"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			tt.edit(&r)
			err := r.Validate()
			var fe *kvroute.FieldError
			switch {
			case tt.field == "" && err != nil:
				t.Errorf("got %v, want nil", err)
			case tt.field != "" && !errors.As(err, &fe):
				t.Errorf("got %v, want a FieldError on %q", err, tt.field)
			case tt.field != "" && fe.Field != tt.field:
				t.Errorf("error on field %q, want %q", fe.Field, tt.field)
			}
		})
	}
}

func TestReplicaRoutable(t *testing.T) {
	tests := []struct {
		name string
		r    kvroute.Replica
		want bool
	}{
		{"never probed", kvroute.Replica{}, true},
		{"healthy", kvroute.Replica{Health: kvroute.HealthHealthy}, true},
		{"unhealthy", kvroute.Replica{Health: kvroute.HealthUnhealthy}, false},
		{"terminating", kvroute.Replica{Health: kvroute.HealthHealthy, State: kvroute.StateTerminating}, false},
		{"gone", kvroute.Replica{State: kvroute.StateGone}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.Routable(); got != tt.want {
				t.Errorf("Routable() = %v, want %v", got, tt.want)
			}
		})
	}
}
