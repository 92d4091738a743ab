package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/kvroute/kvroute/api"
	"github.com/kvroute/kvroute/ingestor"
	"github.com/kvroute/kvroute/internal/app"
	"github.com/kvroute/kvroute/router"
	"github.com/kvroute/kvroute/scoring"
	"github.com/kvroute/kvroute/tokenizer/qwen3"
)

// envPrefix names every flag's environment variable: --overlap-credit is
// KVROUTE_OVERLAP_CREDIT. Containers are configured by environment,
// humans by flags; a flag given on the command line wins.
const envPrefix = "KVROUTE_"

func envName(flagName string) string {
	return envPrefix + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// flagUsage is the -h of a command whose flags the environment also sets
// (applyEnv): about, then every flag with its variable and default, in the
// one format tools and the infra tests read ("--name arg  (env NAME,
// default "v")").
func flagUsage(fs *flag.FlagSet, w io.Writer, command, about string) func() {
	return func() {
		fmt.Fprintf(w, "Usage: kvroute %s [flags]\n\n%sEvery flag can also be set by its environment variable; a flag on the command line wins.\n\n", command, about)
		fs.VisitAll(func(f *flag.Flag) {
			name, usage := flag.UnquoteUsage(f)
			fmt.Fprintf(w, "  --%s %s  (env %s, default %q)\n    \t%s\n", f.Name, name, envName(f.Name), f.DefValue, usage)
		})
	}
}

// runServe is `kvroute serve`: the HTTP scoring pod. Without a Redis URL it
// runs everything in one process over an embedded Redis.
func runServe(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg, lc, err := parseServe(args, os.Getenv, stderr)
	if err != nil {
		return err
	}
	log, err := newLogger(stderr, lc)
	if err != nil {
		return usageError{err}
	}
	if err := lc.access.checkExposure(cfg.Listen); err != nil {
		return usageError{err}
	}
	if err := lc.access.apply(&cfg); err != nil {
		return usageError{err}
	}
	cfg.Logger = log
	if !cfg.Redis.Configured() {
		// Embedded mode: the ingestor follows the replicas' events in
		// this process, over the same in-memory store.
		cfg.Tasks = append(cfg.Tasks, app.Ingest(ingestor.Config{Owner: "embedded", Seed: cfg.Router.Seed}))
	}
	if lc.discover.enabled() {
		if cfg.Redis.Configured() {
			// With Redis, serve runs no ingestor: discovery belongs to
			// the ingestors, which write the registry every pod reads.
			return usageError{errors.New("--discover-* with a Redis store: give these flags to kvroute ingest, which writes the shared registry")}
		}
		dc, err := lc.discover.config(log)
		if err != nil {
			return usageError{err}
		}
		cfg.Tasks = append(cfg.Tasks, app.Discover(dc))
	}
	if lc.demoReplicas > 0 {
		cfg.Tasks = append(cfg.Tasks, app.DemoReplicas(lc.demoReplicas, stdout))
		if _, ok := cfg.Tokenizers.Dirs[app.DemoModel]; !ok {
			// The demo replicas tokenize with the Qwen3 files shipped in
			// the binary; so does kvroute, so chat is cache-aware with
			// no setup and no network.
			cfg.Tokenizers.FS = map[string]fs.FS{app.DemoModel: qwen3.FS}
		}
	}
	return app.Run(ctx, cfg)
}

// logConfig carries the serve flags that are not part of app.Config.
type logConfig struct {
	level, format string
	demoReplicas  int
	// access is who may call what (access.go).
	access *accessFlags
	// discover is the --discover-* flags (discover.go).
	discover discoverFlags
}

// parseServe turns the command line and environment into the app's
// configuration. getenv is injected so that tests need not touch the
// process environment.
func parseServe(args []string, getenv func(string) string, stderr io.Writer) (app.Config, logConfig, error) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	rc := router.DefaultConfig()
	cfg := app.Config{}
	var lc logConfig
	fs.StringVar(&cfg.Listen, "listen", ":8080", "HTTP listen `address` (all interfaces by default: the pod sits behind a load balancer; 127.0.0.1:8080 with --demo-replicas)")
	redisFlags(fs, &cfg.Redis, "Redis `URL` (redis:// or rediss://); with neither this nor --redis-addrs, an embedded in-memory Redis runs in this process")
	cost := addCostFlags(fs, &rc)
	fs.DurationVar(&rc.LeaseTTL, "lease-ttl", rc.LeaseTTL, "minimum life of a load booking; the request's predicted duration is added")
	fs.Uint64Var(&rc.Seed, "seed", rc.Seed, "block-key seed; must be equal on every pod and ingestor sharing a Redis")
	fs.StringVar(&cfg.ReplicasFile, "replicas-file", "", "`file` holding a JSON array of replicas to register at start")
	fs.Int64Var(&cfg.MaxBodyBytes, "max-body-bytes", api.DefaultMaxBodyBytes, "largest request body accepted (413 above)")
	fs.IntVar(&cfg.MaxTokens, "max-tokens", api.DefaultMaxTokens, "most token ids in one request")
	fs.DurationVar(&cfg.RequestTimeout, "request-timeout", api.DefaultTimeout, "deadline of a decision or admin request (proxied streams have none)")
	fs.DurationVar(&cfg.ShutdownTimeout, "shutdown-timeout", 10*time.Second, "how long in-flight requests may drain on SIGTERM")
	dirs := modelDirs{}
	tokForward, tokRemote := true, true
	fs.Var(dirs, "tokenizer", "`MODEL=DIR`: tokenize MODEL's text and chat prompts in process from DIR's tokenizer.json and tokenizer_config.json (repeatable, or comma-separated; DIR \"remote\": its replicas tokenize); a model not listed is tokenized by its replicas")
	fs.BoolVar(&tokRemote, "tokenizer-remote", true, "tokenize the prompts of models without local files on one of their replicas (vLLM's /tokenize); false routes them cache-blind")
	fs.DurationVar(&cfg.Tokenizers.RemoteTimeout, "tokenizer-timeout", 2*time.Second, "deadline of one remote tokenization")
	fs.Float64Var(&cfg.Tokenizers.ShadowRate, "tokenizer-shadow-rate", 0, "fraction (0..1) of locally tokenized prompts also tokenized by a replica and compared; mismatches are counted and logged")
	fs.Int64Var(&cfg.Tokenizers.CacheBytes, "tokenizer-cache-bytes", 64<<20, "tokenization cache per local model, in bytes (multi-turn prompts cost only their new text); negative disables it")
	fs.BoolVar(&tokForward, "token-forwarding", true, "forward a completion's text prompt to the replica as the token ids kvroute computed, so the engine does not tokenize again (once verified: --token-forwarding-verify)")
	addVerifyFlag(fs, &cfg.Tokenizers)
	fs.IntVar(&lc.demoReplicas, "demo-replicas", 0, "start `N` simulated vLLM replicas of model \"demo\" in this process and register them (try-it mode)")
	lc.discover.register(fs)
	addLogFlags(fs, &cfg, &lc)
	lc.access = addAccessFlags(fs, &rc)
	adm := addAdmissionFlags(fs)
	fs.StringVar(&cfg.Pod, "pod-name", "", "`name` this pod is told of its queued requests' admission by; must be unique among the pods sharing a Redis (default: a random id)")
	fs.Usage = flagUsage(fs, stderr, "serve", "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return cfg, lc, err
		}
		return cfg, lc, usageError{err}
	}
	if fs.NArg() > 0 {
		return cfg, lc, usageError{fmt.Errorf("unexpected arguments: %q", fs.Args())}
	}
	if err := applyEnv(fs, getenv); err != nil {
		return cfg, lc, usageError{err}
	}
	if err := checkRedisFlags(cfg.Redis); err != nil {
		return cfg, lc, usageError{err}
	}
	listenSet := false
	fs.Visit(func(f *flag.Flag) { listenSet = listenSet || f.Name == "listen" })
	if lc.demoReplicas > 0 && !listenSet {
		// The try-it mode runs an open admin API (no token to set up), so
		// unless told otherwise it serves this machine only.
		cfg.Listen = "127.0.0.1:8080"
	}
	if err := cost.resolve(&rc); err != nil {
		return cfg, lc, usageError{err}
	}
	if err := lc.access.resolve(rc); err != nil {
		return cfg, lc, usageError{err}
	}
	if r := cfg.Tokenizers.ShadowRate; !(r >= 0 && r <= 1) {
		return cfg, lc, usageError{fmt.Errorf("--tokenizer-shadow-rate must be in 0..1, got %v", r)}
	}
	if cfg.Tokenizers.ShadowRate > 0 && !tokRemote {
		return cfg, lc, usageError{errors.New("--tokenizer-shadow-rate compares with remote tokenization, which --tokenizer-remote=false turns off")}
	}
	if len(dirs) > 0 {
		cfg.Tokenizers.Dirs = dirs
	}
	cfg.Tokenizers.NoRemote, cfg.Tokenizers.NoTokenForwarding = !tokRemote, !tokForward
	var err error
	if rc.Admission, err = adm.config(); err != nil {
		return cfg, lc, usageError{err}
	}
	cfg.Router = rc
	return cfg, lc, nil
}

// modelDirs is the --tokenizer flag: MODEL=DIR pairs, repeatable or
// comma-separated (the environment variable's form). DIR "remote" names
// the default explicitly and records nothing.
type modelDirs map[string]string

func (m modelDirs) String() string {
	var parts []string
	for k, v := range m {
		parts = append(parts, k+"="+v)
	}
	return strings.Join(parts, ",")
}

func (m modelDirs) Set(v string) error {
	for _, pair := range strings.Split(v, ",") {
		model, dir, ok := strings.Cut(strings.TrimSpace(pair), "=")
		if !ok || model == "" || dir == "" {
			return fmt.Errorf("want MODEL=DIR, got %q", pair)
		}
		if dir == "remote" {
			delete(m, model)
			continue
		}
		m[model] = dir
	}
	return nil
}

// applyEnv sets every flag that the command line did not set from its
// environment variable, through the flag's own parser, so that an
// environment value is validated exactly like a flag.
func applyEnv(fs *flag.FlagSet, getenv func(string) string) error {
	given := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { given[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if given[f.Name] {
			return
		}
		if v := getenv(envName(f.Name)); v != "" {
			if err := fs.Set(f.Name, v); err != nil {
				errs = append(errs, fmt.Errorf("%s=%q: %w", envName(f.Name), v, err))
			}
		}
	})
	return errors.Join(errs...)
}

func policyNames() string {
	names := make([]string, len(scoring.Policies))
	for i, p := range scoring.Policies {
		names[i] = string(p)
	}
	return strings.Join(names, ", ")
}

// addVerifyFlag registers --token-forwarding-verify, whose 0 (forward
// unverified) is the front door's negative.
func addVerifyFlag(fs *flag.FlagSet, t *app.Tokenizers) {
	fs.Func("token-forwarding-verify", "`N` text tokenizations of a local model compared with a replica's /tokenize, all equal, before its ids are forwarded; the first mismatch stops forwarding for the model (default 3; 0 forwards unverified, trusting the files)", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return fmt.Errorf("want a whole number of at least 0, got %q", v)
		}
		if t.VerifyMatches = n; n == 0 {
			t.VerifyMatches = -1
		}
		return nil
	})
}

// addLogFlags registers the flags of the process's log and of the API's
// access log.
func addLogFlags(fs *flag.FlagSet, cfg *app.Config, lc *logConfig) {
	fs.StringVar(&lc.level, "log-level", "info", "log `level`: debug, info, warn or error")
	fs.StringVar(&lc.format, "log-format", "text", "log `format`: text or json")
	cfg.AccessLog, cfg.AccessLogEvery = api.AccessLogSampled, api.DefaultAccessLogEvery
	fs.Func("access-log", "which requests get an access-log line, `mode`: off, errors (status >= 400), sampled (errors and one in --access-log-every of the rest) or all (default sampled)", func(v string) (err error) {
		cfg.AccessLog, err = api.ParseAccessLogMode(v)
		return err
	})
	fs.Func("access-log-every", "sampled access log: one line in `N` successful requests (default 100)", func(v string) error {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			return fmt.Errorf("want a whole number of at least 1, got %q", v)
		}
		cfg.AccessLogEvery = n
		return nil
	})
}

func newLogger(w io.Writer, lc logConfig) (*slog.Logger, error) {
	var level slog.Level
	if err := level.UnmarshalText([]byte(lc.level)); err != nil {
		return nil, fmt.Errorf("--log-level: %w", err)
	}
	opts := &slog.HandlerOptions{Level: level}
	switch lc.format {
	case "text":
		return slog.New(slog.NewTextHandler(w, opts)), nil
	case "json":
		return slog.New(slog.NewJSONHandler(w, opts)), nil
	}
	return nil, fmt.Errorf("--log-format must be text or json, got %q", lc.format)
}
