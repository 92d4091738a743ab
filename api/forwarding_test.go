package api_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/internal/mock"
	"github.com/kvroute/kvroute/internal/telemetry"
	"github.com/kvroute/kvroute/internal/wait"
	"github.com/kvroute/kvroute/prompt"
)

// remoteFunc is a replica's tokenizer (vLLM's /tokenize) as a function.
type remoteFunc func(context.Context, kvroute.TokenizeRequest) ([]uint32, error)

func (f remoteFunc) Tokenize(ctx context.Context, req kvroute.TokenizeRequest) ([]uint32, error) {
	return f(ctx, req)
}

// TestForwardingVerified: a completion's text prompt goes to the replica
// as kvroute's ids only once the model's local tokenizer has agreed with
// the replica's (finding 6 of issue 23); until then, and for good after a
// mismatch, it goes as the client sent it.
func TestForwardingVerified(t *testing.T) {
	text := strings.Repeat("a", 40)
	local := mock.ByteEncoder{}.IDs(text, true)
	for _, tt := range []struct {
		name   string
		remote []uint32
		state  float64 // the kvroute_token_forwarding gauge once checked
	}{
		{"agreeing tokenizer", local, 1},
		{"tokenizer one id apart", append(append([]uint32{}, local[:len(local)-1]...), 7), -1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			srv, bodies := usageUpstream(t, 0)
			preg := prometheus.NewRegistry()
			mp, err := telemetry.NewMeterProvider(preg)
			if err != nil {
				t.Fatal(err)
			}
			remote := remoteFunc(func(context.Context, kvroute.TokenizeRequest) ([]uint32, error) { return tt.remote, nil })
			h := newHarness(t, []kvroute.Replica{{ID: "r0", Model: "m", URL: srv.URL}}, withPrompts(t, prometheus.NewRegistry(), prompt.Config{
				Models: map[string]*prompt.Model{"m": {Encoder: mock.ByteEncoder{}}}, Remote: remote, MeterProvider: mp}))
			body := `{"model":"m","prompt":"` + text + `","max_tokens":2}`
			send := func() bool {
				t.Helper()
				if status, _, raw := h.post(t, "/v1/completions", body); status != 200 {
					t.Fatalf("got %d: %s", status, raw)
				}
				var fw struct {
					Prompt json.RawMessage `json:"prompt"`
				}
				if err := json.Unmarshal([]byte(<-bodies), &fw); err != nil {
					t.Fatal(err)
				}
				return strings.HasPrefix(string(fw.Prompt), "[")
			}
			for i := range prompt.DefaultVerifyMatches {
				if send() {
					t.Fatalf("request %d forwarded as ids before the tokenizer was verified", i)
				}
			}
			wait.Until(t, "the forwarding checks done", func() bool {
				return testutil.ToFloat64(gaugeOf(t, preg, "kvroute_token_forwarding")) == tt.state
			})
			if got, want := send(), tt.state == 1; got != want {
				t.Errorf("after the checks: forwarded as ids %v, want %v", got, want)
			}
		})
	}
}

// gaugeOf is the one series of a gathered gauge, as a collector
// testutil.ToFloat64 reads.
func gaugeOf(tb testing.TB, reg *prometheus.Registry, name string) prometheus.Collector {
	tb.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		tb.Fatal(err)
	}
	g := prometheus.NewGauge(prometheus.GaugeOpts{Name: name})
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			g.Set(mf.GetMetric()[0].GetGauge().GetValue())
			return g
		}
	}
	g.Set(-99)
	return g
}
