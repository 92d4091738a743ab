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
