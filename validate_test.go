package kvroute_test

import (
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
)

// TestReplicaValidateAddresses is the SSRF finding: every one of these was
// registered with 201 before.
func TestReplicaValidateAddresses(t *testing.T) {
	ok := kvroute.Replica{ID: "r", Model: "m", URL: "http://10.0.0.5:8000"}
	tests := []struct {
		name  string
		edit  func(*kvroute.Replica)
		field string // "" means valid
	}{
		{"http", func(*kvroute.Replica) {}, ""},
		{"https with a path prefix", func(r *kvroute.Replica) { r.URL = "https://gpu-0.internal/vllm" }, ""},
		{"loopback", func(r *kvroute.Replica) { r.URL = "http://127.0.0.1:8000" }, ""},
		{"ipv6", func(r *kvroute.Replica) { r.URL = "http://[fd00::5]:8000" }, ""},
		{"event endpoints", func(r *kvroute.Replica) { r.Events, r.Replay = "tcp://10.0.0.5:5557", "tcp://gpu-0:5558" }, ""},
		{"file url", func(r *kvroute.Replica) { r.URL = "file:///etc/passwd" }, "url"},
		{"gopher", func(r *kvroute.Replica) { r.URL = "gopher://127.0.0.1:6379/_FLUSHALL" }, "url"},
		{"not a url", func(r *kvroute.Replica) { r.URL = "not a url" }, "url"},
		{"javascript", func(r *kvroute.Replica) { r.URL = "javascript:alert(1)" }, "url"},
		{"credentials", func(r *kvroute.Replica) { r.URL = "http://user:pass@10.0.0.5:8000" }, "url"},
		{"query", func(r *kvroute.Replica) { r.URL = "http://10.0.0.5:8000/?x=1" }, "url"},
		{"fragment", func(r *kvroute.Replica) { r.URL = "http://10.0.0.5:8000/#x" }, "url"},
		{"no host", func(r *kvroute.Replica) { r.URL = "http:///v1" }, "url"},
		{"port 0", func(r *kvroute.Replica) { r.URL = "http://10.0.0.5:0" }, "url"},
		{"decimal address", func(r *kvroute.Replica) { r.URL = "http://2852039166/" }, "url"},
		{"hex address", func(r *kvroute.Replica) { r.URL = "http://0xa9fea9fe/" }, "url"},
		{"control character", func(r *kvroute.Replica) { r.URL = "http://a\x00b/" }, "url"},
		{"events not tcp", func(r *kvroute.Replica) { r.Events = "ipc:///tmp/x" }, "events"},
		{"events without port", func(r *kvroute.Replica) { r.Events = "tcp://10.0.0.5" }, "events"},
		{"events wildcard", func(r *kvroute.Replica) { r.Events = "tcp://*:5557" }, "events"},
		{"replay with path", func(r *kvroute.Replica) { r.Replay = "tcp://10.0.0.5:5558/x" }, "replay"},
		{"model too long", func(r *kvroute.Replica) { r.Model = strings.Repeat("m", 257) }, "model"},
		{"model with newline", func(r *kvroute.Replica) { r.Model = "m\n" }, "model"},
		{"model invalid utf-8", func(r *kvroute.Replica) { r.Model = "m\xff" }, "model"},
		{"id too long", func(r *kvroute.Replica) { r.ID = strings.Repeat("a", 129) }, "id"},
		{"huge label", func(r *kvroute.Replica) { r.Labels = map[string]string{"k": strings.Repeat("v", 7<<20)} }, "labels"},
		{"long label key", func(r *kvroute.Replica) { r.Labels = map[string]string{strings.Repeat("k", 64): "v"} }, "labels"},
		{"too many labels", func(r *kvroute.Replica) { r.Labels = manyLabels(65) }, "labels"},
		{"64 labels", func(r *kvroute.Replica) { r.Labels = manyLabels(64) }, ""},
		{"unknown health", func(r *kvroute.Replica) { r.Health = "sick" }, "health"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := ok
			tt.edit(&r)
			checkField(t, r.Validate(), tt.field)
		})
	}
}

func manyLabels(n int) map[string]string {
	m := map[string]string{}
	for i := range n {
		m[fmt.Sprintf("k%d", i)] = "v"
	}
	return m
}

func checkField(tb testing.TB, err error, field string) {
	tb.Helper()
	var fe *kvroute.FieldError
	switch {
	case field == "" && err != nil:
		tb.Errorf("got %v, want nil", err)
	case field != "" && !errors.As(err, &fe):
		tb.Errorf("got %v, want a FieldError on %q", err, field)
	case field != "" && fe.Field != field:
		tb.Errorf("error on field %q (%v), want %q", fe.Field, err, field)
	}
}

func TestAddressPolicy(t *testing.T) {
	allow := kvroute.AddressPolicy{Allow: []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16")}}
	tests := []struct {
		name   string
		policy kvroute.AddressPolicy
		r      kvroute.Replica
		field  string
	}{
		{"private", kvroute.AddressPolicy{}, kvroute.Replica{URL: "http://10.0.0.5:8000"}, ""},
		{"loopback", kvroute.AddressPolicy{}, kvroute.Replica{URL: "http://127.0.0.1:8000"}, ""},
		{"metadata", kvroute.AddressPolicy{}, kvroute.Replica{URL: "http://169.254.169.254/latest/meta-data/"}, "url"},
		{"link-local", kvroute.AddressPolicy{}, kvroute.Replica{URL: "http://169.254.10.1:8000"}, "url"},
		{"link-local v6", kvroute.AddressPolicy{}, kvroute.Replica{URL: "http://[fe80::1]:8000"}, "url"},
		{"metadata v6", kvroute.AddressPolicy{}, kvroute.Replica{URL: "http://[fd00:ec2::254]/"}, "url"},
		{"mapped metadata", kvroute.AddressPolicy{}, kvroute.Replica{URL: "http://[::ffff:169.254.169.254]/"}, "url"},
		{"metadata name", kvroute.AddressPolicy{}, kvroute.Replica{URL: "http://metadata.google.internal/"}, "url"},
		{"metadata name, upper case", kvroute.AddressPolicy{}, kvroute.Replica{URL: "http://Metadata.Google.Internal./"}, "url"},
		{"unspecified", kvroute.AddressPolicy{}, kvroute.Replica{URL: "http://0.0.0.0:8000"}, "url"},
		{"events at metadata", kvroute.AddressPolicy{}, kvroute.Replica{URL: "http://10.0.0.5", Events: "tcp://169.254.169.254:5557"}, "events"},
		{"replay link-local", kvroute.AddressPolicy{}, kvroute.Replica{URL: "http://10.0.0.5", Replay: "tcp://[fe80::2]:5558"}, "replay"},
		{"allowed link-local", allow, kvroute.Replica{URL: "http://169.254.10.1:8000"}, ""},
		{"allowed metadata", allow, kvroute.Replica{URL: "http://169.254.169.254/"}, ""},
		{"allowed metadata name", allow, kvroute.Replica{URL: "http://metadata.google.internal/"}, ""},
		{"allow does not open v6", allow, kvroute.Replica{URL: "http://[fe80::1]:8000"}, "url"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			checkField(t, tt.policy.Check(tt.r), tt.field)
		})
	}
}
