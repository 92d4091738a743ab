package api_test

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/kvroute/kvroute"
	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/internal/syncbuf"
)

// accessLines are the access-log lines in b ("msg=http").
func accessLines(b *syncbuf.Buffer) []string {
	var out []string
	for _, l := range strings.Split(b.String(), "\n") {
		if strings.Contains(l, "msg=http ") {
			out = append(out, l)
		}
	}
	return out
}

// TestAccessLog sends the same mix to a server in each mode: 20
// successful decisions, 3 bad requests (400) and 5 health probes. The
// access log is written before the response completes its round trip
// (the handler's deferred line runs before the server finishes the
// response), so the count is read once every request has been answered.
func TestAccessLog(t *testing.T) {
	fleet := []kvroute.Replica{{ID: "r0", Model: "m", URL: "http://127.0.0.1:9"}}
	for _, tt := range []struct {
		mode      api.AccessLogMode
		every     int
		wantLines int
		wantOK    int
	}{
		{mode: api.AccessLogOff, wantLines: 0},
		{mode: api.AccessLogErrors, wantLines: 3},
		{mode: "", every: 10, wantLines: 3 + 2, wantOK: 2}, // the default: sampled
		{mode: api.AccessLogSampled, every: 1, wantLines: 3 + 20, wantOK: 20},
		{mode: api.AccessLogAll, wantLines: 3 + 20 + 5, wantOK: 25},
	} {
		name := string(tt.mode)
		if name == "" {
			name = "default"
		}
		t.Run(name, func(t *testing.T) {
			var buf syncbuf.Buffer
			h := newHarness(t, fleet, func(c *api.Config) {
				c.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
				c.AccessLog, c.AccessLogEvery = tt.mode, tt.every
			})
			for range 20 {
				if code, _, body := h.post(t, "/v1/route", `{"model":"m","token_ids":[1,2,3]}`); code != 200 {
					t.Fatalf("route: got %d %s, want 200", code, body)
				}
			}
			for range 3 {
				if code, _, _ := h.post(t, "/v1/route", `{"model":"m","token_ids":"x"}`); code != 400 {
					t.Fatalf("bad route: got %d, want 400", code)
				}
			}
			for range 5 {
				if code, _, _ := h.do(t, "GET", "/healthz", "", ""); code != 200 {
					t.Fatalf("healthz: got %d, want 200", code)
				}
			}
			lines := accessLines(&buf)
			ok := 0
			for _, l := range lines {
				if strings.Contains(l, "status=200") {
					ok++
				}
			}
			if len(lines) != tt.wantLines || ok != tt.wantOK {
				t.Errorf("got %d access-log lines (%d of status 200), want %d (%d):\n%s", len(lines), ok, tt.wantLines, tt.wantOK, strings.Join(lines, "\n"))
			}
		})
	}
	t.Run("unknown mode", func(t *testing.T) {
		if _, err := api.ParseAccessLogMode("some"); err == nil {
			t.Error("ParseAccessLogMode(some): got no error, want one naming the modes")
		}
	})
}
