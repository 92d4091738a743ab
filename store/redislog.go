package store

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// redisLogEvery is how often one kind of go-redis line is logged while it
// repeats: during an outage its pool writes a dial failure per command,
// hundreds a second, and one a few seconds says as much.
const redisLogEvery = 5 * time.Second

// redisLog carries go-redis's own log lines (its connection pool's, which
// it would print on stderr outside the structured log) into a slog
// logger. A line's shape is its format string, a constant in go-redis's
// code, so the shapes are few: the first line of a shape is logged, then
// at most one every redisLogEvery, counting the lines held back.
type redisLog struct {
	mu     sync.Mutex
	to     atomic.Pointer[redisLogTarget]
	shapes map[string]*redisLogShape
}

// redisLogTarget is where the lines go, and the clock that spaces them.
type redisLogTarget struct {
	log *slog.Logger
	now func() time.Time
}

type redisLogShape struct {
	last time.Time
	held int
}

// goRedisLog is the process's: go-redis has one logger per process, not
// one per client. It discards lines until a store is opened.
var (
	goRedisLog        = &redisLog{shapes: map[string]*redisLogShape{}}
	installGoRedisLog sync.Once
)

// installRedisLog hands go-redis's log lines to goRedisLog; NewClient calls
// it, so that no kvroute client writes to stderr.
func installRedisLog() { installGoRedisLog.Do(func() { redis.SetLogger(goRedisLog) }) }

// logRedisTo sends go-redis's lines to log (nil: discarded), spaced by
// now's clock (nil: time.Now). The store opened last receives them; the
// spacing starts again, since the last clock's times are not this one's.
func logRedisTo(log *slog.Logger, now func() time.Time) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if now == nil {
		now = time.Now
	}
	goRedisLog.mu.Lock()
	defer goRedisLog.mu.Unlock()
	clear(goRedisLog.shapes)
	goRedisLog.to.Store(&redisLogTarget{log: log, now: now})
}

// Printf is go-redis's logging interface.
func (l *redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.mu.Lock()
	to := l.to.Load()
	if to == nil {
		l.mu.Unlock()
		return
	}
	now := to.now()
	s := l.shapes[format]
	// A clock that went back logs at once rather than never.
	if s == nil {
		s = &redisLogShape{}
		l.shapes[format] = s
	} else if d := now.Sub(s.last); d >= 0 && d < redisLogEvery {
		s.held++
		l.mu.Unlock()
		return
	}
	held := s.held
	s.last, s.held = now, 0
	l.mu.Unlock()
	line := strings.TrimPrefix(fmt.Sprintf(format, v...), "redis: ")
	if held > 0 {
		to.log.WarnContext(ctx, "go-redis: "+line, "suppressed", held)
		return
	}
	to.log.WarnContext(ctx, "go-redis: "+line)
}
