package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/vllmtest"
)

// Ingest runs an ingestor over the app's own store: the embedded mode,
// where one process both serves decisions and follows the replicas'
// events. Its metrics join the app's /metrics.
func Ingest(cfg ingestor.Config) Task {
	return Task{Name: "ingestor", Run: func(ctx context.Context, a *App) error {
		cfg.Store = a.Store
		cfg.Registerer = a.Registry
		if cfg.Logger == nil {
			cfg.Logger = a.log.With("component", "ingestor")
		}
		if cfg.Seed != a.cfg.Router.Seed {
			return errors.New("ingest: the ingestor's key seed differs from the router's: no request would ever match")
		}
		in, err := ingestor.New(cfg)
		if err != nil {
			return fmt.Errorf("ingest: %w", err)
		}
		return in.Run(ctx)
	}}
}

// DemoModel is the model the demo replicas serve.
const DemoModel = "demo"

// DemoReplicas starts n simulated vLLM replicas in this process, registers
// them (events and replay endpoints included, so the embedded ingestor
// follows them) and prints a request a newcomer can paste. They stop with
// the app.
func DemoReplicas(n int, out io.Writer) Task {
	return Task{Name: "demo-replicas", Run: func(ctx context.Context, a *App) error {
		var reps []*vllmtest.Replica
		defer func() {
			for _, r := range reps {
				_ = r.Stop()
			}
		}()
		for i := range n {
			r, err := vllmtest.New(vllmtest.Config{
				Model: DemoModel, BlockSize: a.cfg.Router.BlockSize, CapacityBlocks: 4096,
				PrefillTokensPerSec: 20_000, DecodeTokensPerSec: 200,
				Logger: a.log.With("component", "demo-replica", "replica", i),
			})
			if err != nil {
				return fmt.Errorf("demo replica: %w", err)
			}
			if err := r.Start(ctx); err != nil {
				return fmt.Errorf("demo replica: %w", err)
			}
			reps = append(reps, r)
			rep := kvroute.Replica{
				ID: fmt.Sprintf("demo-%d", i), Model: DemoModel, URL: r.URL(),
				Events: r.EventsEndpoint(), Replay: r.ReplayEndpoint(), Topic: r.Topic(),
				Labels: map[string]string{"demo": "true"},
			}
			if err := a.Store.PutReplica(ctx, rep); err != nil {
				return fmt.Errorf("demo replica: register: %w", err)
			}
		}
		a.Router.Invalidate()
		_, port, _ := net.SplitHostPort(a.Addr())
		fmt.Fprintf(out, `
kvroute is serving %d simulated vLLM replicas of model %q. Try:

  curl -s localhost:%s/v1/route -d '{"model":"demo","token_ids":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33],"explain":true}'

  curl -s localhost:%s/v1/completions -d '{"model":"demo","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33],"max_tokens":8}'

  curl -s localhost:%s/v1/replicas

The second call caches the prompt on the chosen replica; repeat the first and
it routes back there with matched_blocks 2.

`, n, DemoModel, port, port, port)
		<-ctx.Done()
		return nil
	}}
}
