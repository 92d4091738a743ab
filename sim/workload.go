package sim

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/kvroute/kvroute"
)

// Request is one request of a workload.
type Request struct {
	// Arrival is when the request reaches the router. For a request that
	// Follows another, it is the think time after that request completes.
	Arrival time.Duration
	// Follows is 1 + the index of the request that must complete before
	// this one is sent (the previous turn of an agent loop); 0 means the
	// request is open-loop and arrives at Arrival.
	Follows int
	// Session keys the session policy and the stickiness metric.
	Session string
	// Keys are the prompt's block keys, one per block, in order.
	Keys []kvroute.BlockKey
	// DecodeKeys are keys of blocks the decode fills (the prompt's partial
	// tail completed by output tokens, then output blocks). The engine
	// caches them when the request completes, so a next turn that resends
	// the output can hit them. Optional.
	DecodeKeys []kvroute.BlockKey
	// PromptTokens and OutputTokens size the work.
	PromptTokens, OutputTokens int
	// Priority is the request's admission band (lower first) and Tenant
	// whom its cost is charged to; they matter only with admission.
	Priority int
	Tenant   string
	// fromTrace* say the trace gave Priority or Tenant, which Tag then
	// leaves alone.
	fromTracePriority, fromTraceTenant bool
}

// Workload is a replayable set of requests.
type Workload struct {
	Name string
	// BlockTokens is the tokens per block of Keys (512 for Mooncake traces,
	// kvroute.DefaultBlockSize for generated token workloads).
	BlockTokens int
	Requests    []Request
	// Warm[i], when present, lists key chains already held by replica i
	// (in its engine cache and in the router's index) before the run.
	Warm [][][]kvroute.BlockKey
}

// MooncakeOptions controls LoadMooncake.
type MooncakeOptions struct {
	// BlockTokens is the trace's tokens per hash_id (512 for the Mooncake
	// release). 0 means 512.
	BlockTokens int
	// TimeScale multiplies every timestamp: 0.5 replays twice as fast.
	// 0 means 1.
	TimeScale float64
	// Limit keeps only the first Limit requests; 0 keeps all.
	Limit int
}

type mooncakeLine struct {
	Timestamp    float64  `json:"timestamp"`
	InputLength  int      `json:"input_length"`
	OutputLength int      `json:"output_length"`
	HashIDs      []uint64 `json:"hash_ids"`
	// Priority and Tenant are kvroute's extension of the format, for
	// admission; Mooncake's own traces have neither.
	Priority *int    `json:"priority"`
	Tenant   *string `json:"tenant"`
}

// LoadMooncake reads a Mooncake-format JSONL trace, gzipped or not (the
// trace shipped in traces/ is). Each hash_id is used as a block key as is
// (the trace's ids are already position-unique chained hashes). The trace
// has no session ids; a request's session is its first hash_id, i.e.
// requests that share their first block (system prompt plus the start of a
// conversation) count as one session.
func LoadMooncake(r io.Reader, opt MooncakeOptions) (Workload, error) {
	br := bufio.NewReader(r)
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		zr, err := gzip.NewReader(br)
		if err != nil {
			return Workload{}, fmt.Errorf("sim: trace: %w", err)
		}
		defer zr.Close()
		r = zr
	} else {
		r = br
	}
	if opt.BlockTokens == 0 {
		opt.BlockTokens = 512
	}
	if opt.TimeScale == 0 {
		opt.TimeScale = 1
	}
	if opt.BlockTokens < 0 || opt.TimeScale < 0 {
		return Workload{}, errors.New("sim: block tokens and time scale must be positive")
	}
	w := Workload{Name: "mooncake", BlockTokens: opt.BlockTokens}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(b) == 0 {
			continue
		}
		var m mooncakeLine
		if err := json.Unmarshal(b, &m); err != nil {
			return Workload{}, fmt.Errorf("sim: trace line %d: %w", line, err)
		}
		if m.InputLength < 0 || m.OutputLength < 0 || m.Timestamp < 0 {
			return Workload{}, fmt.Errorf("sim: trace line %d: negative field", line)
		}
		keys := make([]kvroute.BlockKey, len(m.HashIDs))
		for i, h := range m.HashIDs {
			keys[i] = kvroute.BlockKey(h)
		}
		sess := ""
		if len(m.HashIDs) > 0 {
			sess = strconv.FormatUint(m.HashIDs[0], 10)
		}
		req := Request{
			Arrival:      time.Duration(m.Timestamp * opt.TimeScale * float64(time.Millisecond)),
			Session:      sess,
			Keys:         keys,
			PromptTokens: m.InputLength,
			OutputTokens: m.OutputLength,
		}
		if m.Priority != nil {
			req.Priority, req.fromTracePriority = *m.Priority, true
		}
		if m.Tenant != nil {
			req.Tenant, req.fromTraceTenant = *m.Tenant, true
		}
		w.Requests = append(w.Requests, req)
		if opt.Limit > 0 && len(w.Requests) >= opt.Limit {
			break
		}
	}
	if err := sc.Err(); err != nil {
		return Workload{}, fmt.Errorf("sim: reading trace: %w", err)
	}
	return w, nil
}

// tokenGen draws random token ids from a seeded source.
type tokenGen struct{ r *rand.Rand }

func (g tokenGen) tokens(n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(g.r.IntN(50_000))
	}
	return out
}

var genSpace = kvroute.KeySpace{Model: "sim"}

// Herding is the seed's section 3 batch: sessions × turns requests sharing a
// 4-block system prompt that only replica 0 holds at the start, each session
// starting with 3..9 blocks of its own and growing 2 blocks a turn. Every
// request arrives at time 0, turn by turn, so nothing completes while the
// batch is routed and the makespan is the slowest replica's backlog. Each
// request decodes half its prompt's blocks, as in the seed.
func Herding(sessions, turns int, seed uint64) Workload {
	const bs = kvroute.DefaultBlockSize
	g := tokenGen{rand.New(rand.NewPCG(seed, 7))}
	sys := g.tokens(4 * bs)
	w := Workload{Name: "herding", BlockTokens: bs, Warm: [][][]kvroute.BlockKey{{kvroute.BlockKeys(genSpace, bs, sys, nil)}}}
	convo := make([][]uint32, sessions)
	for s := range convo {
		convo[s] = append(append([]uint32(nil), sys...), g.tokens((3+g.r.IntN(7))*bs)...)
	}
	for t := range turns {
		for s := range convo {
			if t > 0 {
				convo[s] = append(convo[s], g.tokens(2*bs)...)
			}
			keys := kvroute.BlockKeys(genSpace, bs, convo[s], nil)
			w.Requests = append(w.Requests, Request{
				Session:      "s" + strconv.Itoa(s),
				Keys:         keys,
				PromptTokens: len(convo[s]),
				OutputTokens: len(keys) / 2 * bs,
			})
		}
	}
	return w
}

// StaleIndex is the seed's section 4 replay: 40 prompts of a shared 4-block
// system prompt plus 4 blocks of their own, sent twice, one at a time
// (gap apart, so each request's events reach the router before the next).
// Run it on one replica with a 60-block cache to see the phantom hit rate.
func StaleIndex(seed uint64, gap time.Duration) Workload {
	const bs = kvroute.DefaultBlockSize
	g := tokenGen{rand.New(rand.NewPCG(seed, 3))}
	sys := g.tokens(4 * bs)
	prompts := make([][]uint32, 40)
	for i := range prompts {
		prompts[i] = append(append([]uint32(nil), sys...), g.tokens(4*bs)...)
	}
	w := Workload{Name: "stale", BlockTokens: bs}
	for pass := range 2 {
		for i, p := range prompts {
			w.Requests = append(w.Requests, Request{
				Arrival:      time.Duration(pass*len(prompts)+i) * gap,
				Session:      "p" + strconv.Itoa(i),
				Keys:         kvroute.BlockKeys(genSpace, bs, p, nil),
				PromptTokens: len(p),
				OutputTokens: 1,
			})
		}
	}
	return w
}

// AgenticOptions shapes Agentic. The zero value of a field takes the
// default named in its comment, which together are the RL rollout of the
// seed's Anyscale experiment 1.
type AgenticOptions struct {
	Sessions        int           // concurrent rollouts (8)
	Turns           int           // turns per rollout (10)
	SystemTokens    int           // shared system prompt, part of the start (1024)
	StartTokens     int           // first prompt incl. system prompt (2048)
	TurnTokens      int           // tokens generated per turn (1024)
	ToolTokens      int           // tokens a tool/env appends per turn (64)
	Stragglers      int           // rollouts whose final turn generates StragglerTokens (2)
	StragglerTokens int           // (8192)
	TurnJitter      int           // ± turns per session for heterogeneous lengths (0)
	Steps           int           // rollout steps, each a new set of sessions (1)
	StepGap         time.Duration // arrival gap between steps (0: all at once)
	Think           time.Duration // delay between a turn completing and the next (0)
	BlockTokens     int           // kvroute.DefaultBlockSize
	Seed            uint64
}

func (o *AgenticOptions) defaults() {
	def := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	def(&o.Sessions, 8)
	def(&o.Turns, 10)
	def(&o.SystemTokens, 1024)
	def(&o.StartTokens, 2048)
	def(&o.TurnTokens, 1024)
	def(&o.ToolTokens, 64)
	def(&o.StragglerTokens, 8192)
	def(&o.Steps, 1)
	def(&o.BlockTokens, kvroute.DefaultBlockSize)
	if o.Stragglers == 0 {
		o.Stragglers = 2
	}
	if o.Stragglers < 0 {
		o.Stragglers = 0
	}
}

// Agentic generates closed-loop multi-turn sessions: every session shares a
// system prompt, each turn resends the whole history (previous prompt, the
// previous output, a short tool result) and is sent when the previous turn
// completes. With the defaults it is the RL rollout of the seed: 8 rollouts
// × 10 turns, 2K-token start, 1K generated tokens a turn, and two stragglers
// whose final turn generates 8K.
func Agentic(opt AgenticOptions) Workload {
	opt.defaults()
	bs := opt.BlockTokens
	g := tokenGen{rand.New(rand.NewPCG(opt.Seed, 11))}
	sys := g.tokens(opt.SystemTokens)
	w := Workload{Name: "agentic", BlockTokens: bs}
	for step := range opt.Steps {
		for s := range opt.Sessions {
			turns := opt.Turns
			if opt.TurnJitter > 0 {
				turns += g.r.IntN(2*opt.TurnJitter+1) - opt.TurnJitter
			}
			turns = max(turns, 1)
			hist := append(append([]uint32(nil), sys...), g.tokens(max(opt.StartTokens-opt.SystemTokens, 0))...)
			prev := 0
			for t := range turns {
				out := opt.TurnTokens
				if t == turns-1 && s < opt.Stragglers {
					out = opt.StragglerTokens
				}
				keys := kvroute.BlockKeys(genSpace, bs, hist, nil)
				output := g.tokens(out)
				full := append(hist, output...)
				all := kvroute.BlockKeys(genSpace, bs, full, nil)
				req := Request{
					Session:      "step" + strconv.Itoa(step) + "/r" + strconv.Itoa(s),
					Keys:         keys,
					DecodeKeys:   all[len(keys):],
					PromptTokens: len(hist),
					OutputTokens: out,
				}
				if prev > 0 {
					req.Follows, req.Arrival = prev, opt.Think
				} else {
					req.Arrival = time.Duration(step) * opt.StepGap
				}
				w.Requests = append(w.Requests, req)
				prev = len(w.Requests)
				hist = append(full, g.tokens(opt.ToolTokens)...)
			}
		}
	}
	return w
}
