package tests_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/kvroute/kvroute/store"
)

// TestBurstAcrossPods: 64 simultaneous identical decisions split over two
// pods on one real Redis must place like the same 64 sent one after
// another (the count on the replica holding the prompt within ±15% of
// the sequential count) in at least 9 of 10 trials. Each trial uses a
// model of its own, so trials start from the same empty load.
func TestBurstAcrossPods(t *testing.T) {
	rp := startRedisProc(t)
	pods := []*pod{startPod(t, rp.url()), startPod(t, rp.url())}
	st, err := store.Open(context.Background(), rp.url(), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	prompt := seqTokens(7, 40*16)
	const n = 64
	holderCount := func(model string, burst bool) int {
		registerFleet(t, st, pods[0].a.Router, model, 4, prompt, 32)
		for _, p := range pods {
			p.a.Router.Invalidate()
		}
		got := make([]routeAnswer, n)
		if burst {
			var start, wg sync.WaitGroup
			start.Add(1)
			for i := range n {
				wg.Go(func() {
					start.Wait()
					got[i] = pods[i%2].decide(t, model, prompt)
				})
			}
			start.Done()
			wg.Wait()
		} else {
			for i := range n {
				got[i] = pods[i%2].decide(t, model, prompt)
			}
		}
		held := 0
		for _, a := range got {
			if a.status != 200 || a.Degraded {
				t.Fatalf("%s: decision %+v", model, a)
			}
			if a.Replica.ID == model+"-r0" {
				held++
			}
		}
		return held
	}
	seq := holderCount("burst-seq", false)
	if seq == 0 || seq == n {
		t.Fatalf("sequential placement put %d of %d on the holder: the scenario does not test spreading", seq, n)
	}
	within := 0
	var counts []int
	for trial := range 10 {
		c := holderCount(fmt.Sprintf("burst-%d", trial), true)
		counts = append(counts, c)
		if diff := c - seq; float64(diff) <= 0.15*float64(seq) && float64(-diff) <= 0.15*float64(seq) {
			within++
		}
	}
	t.Logf("sequential: %d of %d on the holder; bursts over two pods: %v", seq, n, counts)
	if within < 9 {
		t.Errorf("%d of 10 bursts placed within ±15%% of the sequential %d, want at least 9 (got %v)", within, seq, counts)
	}
}
