package vllmtest_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvroute/kvroute/vllmtest"
)

// generate posts a completion and returns the response (status and
// headers) and what its body gave before its end or error.
func generate(tb testing.TB, ctx context.Context, r *vllmtest.Replica, body string) (*http.Response, string, error) {
	tb.Helper()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, r.URL()+"/v1/completions", strings.NewReader(body))
	if err != nil {
		tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp, string(b), err
}

func TestHangBeforeHeaders(t *testing.T) {
	r := start(t, vllmtest.Config{})
	r.HangBeforeHeaders(true)
	t.Run("generation gets no headers", func(t *testing.T) {
		ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
		defer cancel()
		if resp, _, err := generate(t, ctx, r, `{"prompt":[1,2,3],"max_tokens":2}`); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("got %v %v, want the client's deadline (no headers)", resp, err)
		}
	})
	t.Run("health still answers", func(t *testing.T) {
		resp, err := http.Get(r.URL() + "/health")
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("health %d, want 200", resp.StatusCode)
		}
	})
	t.Run("released, it serves again", func(t *testing.T) {
		r.HangBeforeHeaders(false)
		resp, _, err := generate(t, context.Background(), r, `{"prompt":[1,2,3],"max_tokens":2}`)
		if err != nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("got %v %v, want 200", resp, err)
		}
	})
}

func TestDieMidResponse(t *testing.T) {
	r := start(t, vllmtest.Config{})
	r.DieMidResponse(2)
	t.Run("stream cut after two events", func(t *testing.T) {
		resp, got, err := generate(t, context.Background(), r, `{"prompt":[1,2,3],"max_tokens":5,"stream":true}`)
		if resp == nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("got %v %v, want a 200 stream", resp, err)
		}
		if !errors.Is(err, io.ErrUnexpectedEOF) {
			t.Errorf("body error %v, want unexpected EOF (no chunked terminator)", err)
		}
		if n := strings.Count(got, "data: "); n != 2 || strings.Contains(got, "[DONE]") {
			t.Errorf("got %d events (%q), want 2 and no [DONE]", n, got)
		}
	})
	t.Run("body cut after half", func(t *testing.T) {
		resp, got, err := generate(t, context.Background(), r, `{"prompt":[1,2,3],"max_tokens":5}`)
		if resp == nil || resp.StatusCode != http.StatusOK {
			t.Fatalf("got %v %v, want 200", resp, err)
		}
		if !errors.Is(err, io.ErrUnexpectedEOF) || len(got) == 0 || int64(len(got)) >= resp.ContentLength {
			t.Errorf("read %d of %d bytes, error %v; want part of it and unexpected EOF", len(got), resp.ContentLength, err)
		}
	})
	t.Run("whole again", func(t *testing.T) {
		r.DieMidResponse(-1)
		_, got, err := generate(t, context.Background(), r, `{"prompt":[1,2,3],"max_tokens":5,"stream":true}`)
		if err != nil || !strings.HasSuffix(got, "data: [DONE]\n\n") {
			t.Errorf("got %q %v, want a whole stream", got, err)
		}
	})
}
