package vllmtest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

func (r *Replica) handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/completions", func(w http.ResponseWriter, req *http.Request) { r.serveGenerate(w, req, false) })
	mux.HandleFunc("POST /v1/chat/completions", func(w http.ResponseWriter, req *http.Request) { r.serveGenerate(w, req, true) })
	mux.HandleFunc("POST /v1/completions/render", func(w http.ResponseWriter, req *http.Request) { r.serveRender(w, req, false) })
	mux.HandleFunc("POST /v1/chat/completions/render", func(w http.ResponseWriter, req *http.Request) { r.serveRender(w, req, true) })
	mux.HandleFunc("POST /tokenize", r.serveTokenize)
	mux.HandleFunc("GET /health", r.serveHealth)
	mux.HandleFunc("GET /metrics", r.serveMetrics)
	mux.HandleFunc("GET /v1/models", r.serveModels)
	mux.HandleFunc("GET /debug/blocks", r.serveBlocks)
	return mux
}

// genRequest is the union of the completion and chat request fields the
// replica honours; everything else is ignored as vLLM ignores unknown
// sampling parameters it does not need here. Messages and the chat
// options stay raw JSON, so that a chat template gets them as sent.
type genRequest struct {
	Model                string          `json:"model"`
	Prompt               json.RawMessage `json:"prompt"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools"`
	Documents            json.RawMessage `json:"documents"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
	ReasoningEffort      string          `json:"reasoning_effort"`
	MaxTokens            *int            `json:"max_tokens"`
	MaxCompletionTokens  *int            `json:"max_completion_tokens"`
	Stream               bool            `json:"stream"`
	StreamOptions        *streamOptions  `json:"stream_options"`
	CacheSalt            string          `json:"cache_salt"`
	AddSpecialTokens     *bool           `json:"add_special_tokens"`
	AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
	ContinueFinalMessage bool            `json:"continue_final_message"`
	Priority             int             `json:"priority"`
}

type streamOptions struct {
	IncludeUsage bool `json:"include_usage"`
}

type apiError struct {
	code int
	msg  string
}

func (e *apiError) Error() string { return e.msg }

func badRequest(format string, args ...any) error {
	return &apiError{code: http.StatusBadRequest, msg: fmt.Sprintf(format, args...)}
}

func writeError(w http.ResponseWriter, err error) {
	code, typ := http.StatusInternalServerError, "InternalServerError"
	var ae *apiError
	if errors.As(err, &ae) {
		code = ae.code
		switch code {
		case http.StatusNotFound:
			typ = "NotFoundError"
		case http.StatusBadRequest:
			typ = "BadRequestError"
		}
	}
	writeJSON(w, code, map[string]any{"error": map[string]any{
		"message": err.Error(), "type": typ, "param": nil, "code": code,
	}})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// lora resolves the request's model to "" (base model) or an adapter name.
func (r *Replica) lora(model string) (string, error) {
	if model == "" || model == r.cfg.Model {
		return "", nil
	}
	for _, l := range r.cfg.LoRAs {
		if l == model {
			return l, nil
		}
	}
	return "", &apiError{code: http.StatusNotFound, msg: fmt.Sprintf("The model `%s` does not exist.", model)}
}

func (r *Replica) serveHealth(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	ok := r.healthy
	r.mu.Unlock()
	if !ok {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// serveBlocks reports how many blocks the prefix cache holds, read-only,
// so that a test over a sim-replica process (which has no Go handle on the
// Replica) can compare the index with the truth.
// serveBlocks reports what the cache holds and the seq the next event
// batch will carry, read together: a test compares both with the index
// (its block count and applied seq, which must be next_seq - 1).
func (r *Replica) serveBlocks(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	blocks, next := r.cache.len(), int64(r.seq)
	r.mu.Unlock()
	writeJSON(w, http.StatusOK, map[string]any{"blocks": blocks, "next_seq": next})
}

func (r *Replica) serveModels(w http.ResponseWriter, _ *http.Request) {
	data := []map[string]any{{"id": r.cfg.Model, "object": "model", "owned_by": "vllm", "root": r.cfg.Model, "max_model_len": r.cfg.MaxModelLen}}
	for _, l := range r.cfg.LoRAs {
		data = append(data, map[string]any{"id": l, "object": "model", "owned_by": "vllm", "root": l, "parent": r.cfg.Model})
	}
	writeJSON(w, http.StatusOK, map[string]any{"object": "list", "data": data})
}

// serveMetrics writes the vLLM series kvroute scrapes, in Prometheus text
// format with the names and labels a real replica uses.
func (r *Replica) serveMetrics(w http.ResponseWriter, _ *http.Request) {
	r.mu.Lock()
	running, waiting := r.running, r.waiting
	usage := float64(r.cache.len()) / float64(r.cfg.CapacityBlocks)
	queries, hits := r.queries, r.hits
	r.mu.Unlock()

	lbl := fmt.Sprintf(`engine="%d",model_name=%q`, r.cfg.DataParallelRank, r.cfg.Model)
	var b strings.Builder
	series := func(name, typ, help string, labels string, v float64) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %g\n", name, help, name, typ, name, labels, v)
	}
	series("vllm:num_requests_running", "gauge", "Number of requests in model execution batches.", lbl, float64(running))
	series("vllm:num_requests_waiting", "gauge", "Number of requests waiting to be processed.", lbl, float64(waiting))
	series("vllm:kv_cache_usage_perc", "gauge", "KV-cache usage. 1 means 100 percent usage.", lbl, usage)
	series("vllm:prefix_cache_queries_total", "counter", "Prefix cache queries, in terms of number of queried tokens.", lbl, float64(queries))
	series("vllm:prefix_cache_hits_total", "counter", "Prefix cache hits, in terms of number of cached tokens.", lbl, float64(hits))
	series("vllm:num_preemptions_total", "counter", "Cumulative number of preemption from the engine.", lbl, 0)
	series("vllm:cache_config_info", "gauge", "Information of the LLMEngine CacheConfig",
		fmt.Sprintf(`block_size="%d",enable_prefix_caching="True",engine="%d",model_name=%q,num_gpu_blocks="%d",prefix_caching_hash_algo="sha256_cbor"`,
			r.cfg.BlockSize, r.cfg.DataParallelRank, r.cfg.Model, r.cfg.CapacityBlocks), 1)
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}

// serveGenerate runs one completion or chat request through the simulated
// scheduler: wait for a running slot, admit the prompt into the cache
// (publishing its batch), sleep for the uncached prefill, then decode.
func (r *Replica) serveGenerate(w http.ResponseWriter, req *http.Request, chat bool) {
	ctx := req.Context()
	var g genRequest
	if err := json.NewDecoder(req.Body).Decode(&g); err != nil {
		writeError(w, badRequest("invalid JSON: %v", err))
		return
	}
	lora, prompt, maxTokens, err := r.parseGenerate(&g, chat)
	if err != nil {
		writeError(w, err)
		return
	}

	if err := r.checkPriority(g.Priority); err != nil {
		writeError(w, err)
		return
	}
	if r.hung(ctx, w) {
		return
	}
	release, err := r.schedule(ctx, g.Priority)
	if err != nil {
		return // the client went away while waiting
	}
	defer release()

	cached, err := r.admit(prompt, lora, g.CacheSalt)
	if err != nil {
		writeError(w, err)
		return
	}
	if !sleep(ctx, perTokens(len(prompt)-cached, r.cfg.PrefillTokensPerSec)) {
		return
	}

	model := g.Model
	if model == "" {
		model = r.cfg.Model
	}
	r.mu.Lock()
	r.reqID++
	id := fmt.Sprintf("%s-%d", map[bool]string{false: "cmpl", true: "chatcmpl"}[chat], r.reqID)
	r.mu.Unlock()
	resp := response{id: id, model: model, created: r.cfg.Now().Unix(), chat: chat, usage: usage{
		PromptTokens: len(prompt), CompletionTokens: maxTokens, TotalTokens: len(prompt) + maxTokens,
		PromptTokensDetails: &promptDetails{CachedTokens: cached},
	}}
	out := generated(maxTokens)
	if g.Stream {
		r.stream(ctx, w, resp, out, g.StreamOptions != nil && g.StreamOptions.IncludeUsage)
		return
	}
	if !sleep(ctx, time.Duration(maxTokens)*perTokens(1, r.cfg.DecodeTokensPerSec)) {
		return
	}
	if n := r.dieAt(); n >= 0 {
		b, _ := json.Marshal(resp.full(decode(out)))
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Content-Length", strconv.Itoa(len(b)+1))
		w.WriteHeader(http.StatusOK)
		_, _ = w.Write(b[:len(b)/2])
		die(w)
		return
	}
	writeJSON(w, http.StatusOK, resp.full(decode(out)))
}

// stream sends out as vLLM streams it: a chunk per token (after the
// role's, for chat), the usage chunk when asked, then data: [DONE]; or
// only the first DieMidResponse events, then the connection is cut.
func (r *Replica) stream(ctx context.Context, w http.ResponseWriter, resp response, out []int, withUsage bool) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	flusher, _ := w.(http.Flusher)
	left := r.dieAt()
	send := func(v any) bool {
		if left == 0 {
			die(w)
			return false
		}
		left--
		b, err := json.Marshal(v)
		if err != nil {
			return false
		}
		if _, err := fmt.Fprintf(w, "data: %s\n\n", b); err != nil {
			return false
		}
		if flusher != nil {
			flusher.Flush()
		}
		return true
	}
	if resp.chat && !send(resp.chunk(map[string]any{"role": "assistant", "content": ""}, nil)) {
		return
	}
	step := perTokens(1, r.cfg.DecodeTokensPerSec)
	for i := range out {
		if !sleep(ctx, step) {
			return
		}
		var finish any
		if i == len(out)-1 {
			finish = "length"
		}
		if !send(resp.chunk(decode(out[i:i+1]), finish)) {
			return
		}
	}
	if len(out) == 0 && !send(resp.chunk("", "length")) {
		return
	}
	if withUsage && !send(resp.usageChunk()) {
		return
	}
	if left == 0 {
		die(w)
		return
	}
	_, _ = fmt.Fprint(w, "data: [DONE]\n\n")
	if flusher != nil {
		flusher.Flush()
	}
}

func perTokens(n int, rate float64) time.Duration {
	if rate <= 0 || n <= 0 {
		return 0
	}
	return time.Duration(float64(n) / rate * float64(time.Second))
}

// sleep waits d or until ctx ends, reporting whether the full d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

type usage struct {
	PromptTokens        int            `json:"prompt_tokens"`
	TotalTokens         int            `json:"total_tokens"`
	CompletionTokens    int            `json:"completion_tokens"`
	PromptTokensDetails *promptDetails `json:"prompt_tokens_details"`
}

type promptDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// response builds the OpenAI-shaped bodies of one request.
type response struct {
	id, model string
	created   int64
	chat      bool
	usage     usage
}

func (p response) object(stream bool) string {
	switch {
	case p.chat && stream:
		return "chat.completion.chunk"
	case p.chat:
		return "chat.completion"
	}
	return "text_completion"
}

func (p response) full(text string) map[string]any {
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": "length", "stop_reason": nil}
	if p.chat {
		choice["message"] = map[string]any{"role": "assistant", "content": text}
	} else {
		choice["text"] = text
	}
	return map[string]any{"id": p.id, "object": p.object(false), "created": p.created, "model": p.model,
		"choices": []any{choice}, "usage": p.usage}
}

// chunk is one streamed token; delta is the text (completions) or the
// delta object or text (chat).
func (p response) chunk(delta any, finish any) map[string]any {
	choice := map[string]any{"index": 0, "logprobs": nil, "finish_reason": finish}
	if p.chat {
		if s, ok := delta.(string); ok {
			delta = map[string]any{"content": s}
		}
		choice["delta"] = delta
	} else {
		choice["text"] = delta
		choice["stop_reason"] = nil
	}
	return map[string]any{"id": p.id, "object": p.object(true), "created": p.created, "model": p.model,
		"choices": []any{choice}}
}

func (p response) usageChunk() map[string]any {
	return map[string]any{"id": p.id, "object": p.object(true), "created": p.created, "model": p.model,
		"choices": []any{}, "usage": p.usage}
}
