// Package wait lets a test wait for a cause (a key, a metric, a log line,
// a state) instead of for the clock. A fixed sleep is too short on a busy
// machine and too long on an idle one; a hand-written deadline loop picks
// a bound that a loaded CI runner outlasts. Until polls with backoff and
// is bounded by the test's own deadline (go test -timeout), so the only
// way it gives up early is a test that cannot make progress, and then it
// names what it waited for.
package wait

import (
	"testing"
	"time"
)

// Bounds of the polling interval: the first poll is soon, so that a
// condition that holds at once costs nothing, and the interval doubles up
// to a tenth of a second, so that a long wait does not spin a CPU that the
// awaited process needs.
const (
	firstPoll = time.Millisecond
	maxPoll   = 100 * time.Millisecond
)

// noDeadline is the bound when the test has no deadline (-timeout 0) or
// is a benchmark: generous, since a wait is for a cause and a test that
// waits this long is stuck.
const noDeadline = 10 * time.Minute

// Until calls cond until it reports true, and fails the test (Fatal)
// naming what when it has not by the test's deadline less a margin left
// for the failure to be reported and the cleanups to run. It must be
// called from the test's goroutine, as Fatal must.
func Until(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	if err := poll(tb, cond); err != nil {
		tb.Fatalf("waited %v for %s: it did not happen", err.waited.Round(time.Millisecond), what)
	}
}

// UntilNil is Until for a condition that says why it does not hold yet:
// cond returning nil ends the wait, and the last error it returned is in
// the failure's message.
func UntilNil(tb testing.TB, what string, cond func() error) {
	tb.Helper()
	var last error
	if err := poll(tb, func() bool { last = cond(); return last == nil }); err != nil {
		tb.Fatalf("waited %v for %s: %v", err.waited.Round(time.Millisecond), what, last)
	}
}

// Recv returns the next value from ch, failing the test naming what when
// none comes by the test's deadline (or when ch is closed).
func Recv[T any](tb testing.TB, what string, ch <-chan T) T {
	tb.Helper()
	start := time.Now()
	timer := time.NewTimer(bound(tb))
	defer timer.Stop()
	select {
	case v, ok := <-ch:
		if !ok {
			tb.Fatalf("waiting for %s: the channel was closed", what)
		}
		return v
	case <-timer.C:
		tb.Fatalf("waited %v for %s: it did not come", time.Since(start).Round(time.Millisecond), what)
	}
	panic("unreachable")
}

type timedOut struct{ waited time.Duration }

func poll(tb testing.TB, cond func() bool) *timedOut {
	start := time.Now()
	end := start.Add(bound(tb))
	for d := firstPoll; ; d = min(2*d, maxPoll) {
		if cond() {
			return nil
		}
		if !time.Now().Before(end) {
			return &timedOut{waited: time.Since(start)}
		}
		time.Sleep(min(d, max(time.Until(end), 0)))
	}
}

// bound is how long a wait may last: up to the test's deadline, less a
// margin (a tenth of what is left, at most 10 s) in which the failure is
// reported rather than the binary killed by the test timeout's panic.
// Inside a testing/synctest bubble the clock is the bubble's, which
// starts in 2000: the deadline is then far ahead, and a wait there ends
// by its condition or by the bubble's own deadlock detection.
func bound(tb testing.TB) time.Duration {
	d, ok := deadline(tb)
	if !ok {
		return noDeadline
	}
	left := time.Until(d)
	return max(left-min(left/10, 10*time.Second), 0)
}

func deadline(tb testing.TB) (time.Time, bool) {
	if t, ok := tb.(interface{ Deadline() (time.Time, bool) }); ok {
		return t.Deadline()
	}
	return time.Time{}, false
}
