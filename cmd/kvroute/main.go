// Command kvroute is the KV-cache-aware router for vLLM fleets. main only
// parses the command line and wires packages together; every subcommand is
// a run function taking its context, arguments and output streams, so that
// tests drive it without a process.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=...";
// otherwise the module's build info is used.
var version = ""

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// commands maps subcommand names to their run functions.
var commands = map[string]func(ctx context.Context, args []string, stdout, stderr io.Writer) error{
	"serve":       runServe,
	"ingest":      runIngest,
	"sim":         runSim,
	"sim-replica": runSimReplica,
	"version":     runVersion,
	"tokenize": func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		return runTokenize(ctx, args, os.Stdin, stdout, stderr)
	},
}

const usage = `kvroute: KV-cache-aware request routing for vLLM fleets.

Usage:
  kvroute serve   [flags]   HTTP scoring pod: /v1/route, OpenAI proxy, admin API
                            (no --redis-url: embedded Redis, all in one process)
  kvroute ingest  [flags]   follow replicas' KV cache events into Redis
  kvroute sim     [flags]   replay a trace against engine models, compare policies
  kvroute sim-replica [flags]
                            a simulated vLLM replica (no GPU): OpenAI API, KV cache events
  kvroute tokenize --tokenizer DIR [--add-special-tokens] [--chat] [--jsonl] [TEXT]
                            print the token ids kvroute computes (compare with your engine)
  kvroute version           print the version
  kvroute help              this text

Run 'kvroute <command> -h' for a command's flags.
`

// run executes one command line and returns the process exit code: 0 on
// success (and on -h), 2 for a usage error, 1 when the command fails.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return 2
	}
	name, rest := args[0], args[1:]
	switch name {
	case "help", "-h", "-help", "--help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	cmd, ok := commands[name]
	if !ok {
		fmt.Fprintf(stderr, "kvroute: unknown command %q\n\n%s", name, usage)
		return 2
	}
	err := cmd(ctx, rest, stdout, stderr)
	var ue usageError
	switch {
	case err == nil:
		return 0
	case errors.Is(err, flag.ErrHelp):
		return 0
	case errors.As(err, &ue):
		fmt.Fprintf(stderr, "kvroute %s: %v\n", name, err)
		return 2
	default:
		fmt.Fprintf(stderr, "kvroute %s: %v\n", name, err)
		return 1
	}
}

// usageError is a bad command line, as opposed to a failure while running.
type usageError struct{ error }

func (e usageError) Unwrap() error { return e.error }

func runVersion(_ context.Context, _ []string, stdout, _ io.Writer) error {
	fmt.Fprintln(stdout, "kvroute", versionString())
	return nil
}

func versionString() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}
