package wait_test

import (
	"errors"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/kvroute/kvroute/internal/wait"
)

// fakeTB is a test whose deadline is given and whose Fatalf is recorded
// (and ends the goroutine, as testing's does).
type fakeTB struct {
	testing.TB
	deadline time.Time
	fatal    string
}

func (f *fakeTB) Helper()                     {}
func (f *fakeTB) Deadline() (time.Time, bool) { return f.deadline, !f.deadline.IsZero() }
func (f *fakeTB) Fatalf(format string, args ...any) {
	f.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls body with f on a goroutine of its own, as Goexit needs.
func run(f *fakeTB, body func(testing.TB)) {
	done := make(chan struct{})
	go func() { defer close(done); body(f) }()
	<-done
}

func TestUntil(t *testing.T) {
	t.Run("holds after a few polls", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &fakeTB{TB: t, deadline: time.Now().Add(time.Minute)}
			calls := 0
			run(f, func(tb testing.TB) { wait.Until(tb, "the third call", func() bool { calls++; return calls == 3 }) })
			if f.fatal != "" || calls != 3 {
				t.Errorf("calls = %d, fatal %q; want 3 calls and no failure", calls, f.fatal)
			}
		})
	})
	t.Run("bounded by the test's deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			start := time.Now()
			f := &fakeTB{TB: t, deadline: start.Add(time.Minute)}
			run(f, func(tb testing.TB) { wait.Until(tb, "a key", func() bool { return false }) })
			if !strings.Contains(f.fatal, "for a key") {
				t.Errorf("fatal = %q; want it to name what it waited for", f.fatal)
			}
			// The margin: a tenth of what was left, at most 10 s.
			if got, want := time.Since(start), 54*time.Second; got != want {
				t.Errorf("gave up after %v, want %v (the deadline less its margin)", got, want)
			}
		})
	})
	t.Run("polls back off", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &fakeTB{TB: t, deadline: time.Now().Add(time.Hour)}
			var at []time.Time
			run(f, func(tb testing.TB) {
				wait.Until(tb, "ten polls", func() bool { at = append(at, time.Now()); return len(at) == 10 })
			})
			if gap := at[9].Sub(at[8]); gap != 100*time.Millisecond {
				t.Errorf("last gap = %v, want the 100 ms cap", gap)
			}
			if gap := at[1].Sub(at[0]); gap != time.Millisecond {
				t.Errorf("first gap = %v, want 1 ms", gap)
			}
		})
	})
}

func TestUntilNil(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &fakeTB{TB: t, deadline: time.Now().Add(time.Second)}
		run(f, func(tb testing.TB) {
			wait.UntilNil(tb, "the replica", func() error { return errors.New("connection refused") })
		})
		if !strings.Contains(f.fatal, "for the replica: connection refused") {
			t.Errorf("fatal = %q; want what it waited for and the last error", f.fatal)
		}
	})
}

func TestRecv(t *testing.T) {
	t.Run("a value", func(t *testing.T) {
		ch := make(chan int, 1)
		ch <- 7
		if got := wait.Recv(t, "seven", ch); got != 7 {
			t.Errorf("got %d, want 7", got)
		}
	})
	t.Run("closed", func(t *testing.T) {
		f := &fakeTB{TB: t, deadline: time.Now().Add(time.Minute)}
		ch := make(chan int)
		close(ch)
		run(f, func(tb testing.TB) { wait.Recv(tb, "a value", ch) })
		if !strings.Contains(f.fatal, "closed") {
			t.Errorf("fatal = %q; want it to say the channel was closed", f.fatal)
		}
	})
	t.Run("none by the deadline", func(t *testing.T) {
		synctest.Test(t, func(t *testing.T) {
			f := &fakeTB{TB: t, deadline: time.Now().Add(time.Minute)}
			run(f, func(tb testing.TB) { wait.Recv(tb, "a batch", make(chan int)) })
			if !strings.Contains(f.fatal, "for a batch") {
				t.Errorf("fatal = %q; want it to name what it waited for", f.fatal)
			}
		})
	})
}
