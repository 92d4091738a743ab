package discovery

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
)

// maxModelsBody bounds the /v1/models answer read: a server lists a base
// model and its adapters, a few kilobytes; anything far larger is not a
// vLLM server's answer.
const maxModelsBody = 1 << 20

// served is what a server's /v1/models says it serves: the base model and
// the LoRA adapters loaded on it.
type served struct {
	Model    string
	Adapters []string
}

// lookupModels asks the server at baseURL what it serves. vLLM lists the
// base model (every --served-model-name) with no parent, and each LoRA
// adapter with its base model as parent; the first entry without a parent
// is the model the replica is registered under.
func lookupModels(ctx context.Context, c *http.Client, baseURL string) (served, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(baseURL, "/")+"/v1/models", nil)
	if err != nil {
		return served{}, fmt.Errorf("models: %w", err)
	}
	resp, err := c.Do(req)
	if err != nil {
		return served{}, fmt.Errorf("models: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxModelsBody))
		return served{}, fmt.Errorf("models: %s answered %s", req.URL, resp.Status)
	}
	var body struct {
		Data []struct {
			ID     string  `json:"id"`
			Parent *string `json:"parent"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxModelsBody)).Decode(&body); err != nil {
		return served{}, fmt.Errorf("models: %s: %w", req.URL, err)
	}
	var s served
	for _, m := range body.Data {
		switch {
		case m.ID == "":
		case m.Parent == nil || *m.Parent == "":
			if s.Model == "" {
				s.Model = m.ID
			}
		default:
			s.Adapters = append(s.Adapters, m.ID)
		}
	}
	if s.Model == "" {
		return served{}, fmt.Errorf("models: %s lists no base model", req.URL)
	}
	return s, nil
}
