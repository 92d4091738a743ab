package api

import (
	"fmt"
	"log/slog"
	"strings"
)

// AccessLogMode says which requests get an access-log line. A pod at a
// few thousand decisions a second writing one INFO line for each spends
// more on its logs than on its decisions and buries the lines that say
// something went wrong, so the default keeps every error and a sample of
// the rest.
type AccessLogMode string

const (
	// AccessLogOff writes no access-log line.
	AccessLogOff AccessLogMode = "off"
	// AccessLogErrors writes a line for every answer of status 400 or
	// more, and nothing for the rest.
	AccessLogErrors AccessLogMode = "errors"
	// AccessLogSampled writes every error's line and one in
	// Config.AccessLogEvery of the others (counted, not random, so a
	// steady load logs at a steady rate).
	AccessLogSampled AccessLogMode = "sampled"
	// AccessLogAll writes a line for every request, probes and scrapes
	// included (at DEBUG, as they arrive every few seconds from every
	// orchestrator).
	AccessLogAll AccessLogMode = "all"
)

// DefaultAccessLogEvery is the sampled mode's one line in so many
// successful requests.
const DefaultAccessLogEvery = 100

// ParseAccessLogMode reads a mode as the --access-log flag spells it.
func ParseAccessLogMode(s string) (AccessLogMode, error) {
	switch m := AccessLogMode(strings.ToLower(strings.TrimSpace(s))); m {
	case AccessLogOff, AccessLogErrors, AccessLogSampled, AccessLogAll:
		return m, nil
	}
	return "", fmt.Errorf("access log mode must be off, errors, sampled or all, got %q", s)
}

// accessLevel is the level of a request's access-log line, and false when
// the mode writes none for it. Probes (health, readiness, scrapes) are
// logged only in AccessLogAll, or when they fail.
func (s *Server) accessLevel(status int, probe bool) (slog.Level, bool) {
	failed := status >= 400
	switch s.cfg.AccessLog {
	case AccessLogOff:
		return 0, false
	case AccessLogAll:
		if probe && !failed {
			return slog.LevelDebug, true
		}
		return slog.LevelInfo, true
	}
	if failed {
		if status >= 500 {
			return slog.LevelWarn, true
		}
		return slog.LevelInfo, true
	}
	if s.cfg.AccessLog == AccessLogErrors || probe {
		return 0, false
	}
	return slog.LevelInfo, s.accessSeen.Add(1)%uint64(s.cfg.AccessLogEvery) == 1%uint64(s.cfg.AccessLogEvery)
}
