// Command scorer scores earnings-call transcripts with a zero-shot NLI model.
//
//	scorer run       the streaming service: Kafka in → scored → Kafka out
//	scorer score     offline: TranscriptEvent JSONL in, ScoredTranscript JSONL out
//	scorer broker    an in-memory Kafka-protocol broker, for development and tests
//	scorer produce   load a TranscriptEvent JSONL file into a topic
//	scorer bench     benchmarks (see docs/benchmarks.md)
//	scorer doctor    whether the configured DEVICE works on this host (see docs/gpu.md)
//	scorer compare   two models on one sample: |Δp|, decision agreement, speed
//	scorer gpu-proof the GPU measurements of make gpu-proof: bench, share, report (see docs/gpu.md)
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/scorer/scorer/internal/bench"
	"github.com/scorer/scorer/internal/broker"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/compare"
	"github.com/scorer/scorer/internal/doctor"
	"github.com/scorer/scorer/internal/offline"
	"github.com/scorer/scorer/internal/produce"
	"github.com/scorer/scorer/internal/proof"
	"github.com/scorer/scorer/internal/service"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// After the first signal the default action is back: a second one
	// kills the process (run keeps draining on the first).
	context.AfterFunc(ctx, stop)
	err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr)
	if err != nil && !errors.Is(err, cli.ErrUsage) {
		fmt.Fprintln(os.Stderr, "scorer:", err)
	}
	if err != nil {
		os.Exit(cli.ExitCode(err))
	}
}

// command is one subcommand: its spec (help, docs) and its entry point.
type command struct {
	spec cli.Spec
	run  func(context.Context, cli.Env, []string) error
}

// commands is every subcommand, in the order `scorer -h` lists them.
var commands = []command{
	{service.Spec, service.Command},
	{offline.Spec, offline.Command},
	{broker.Spec, broker.Command},
	{produce.Spec, produce.Command},
	{bench.Spec, bench.Command},
	{doctor.Spec, doctor.Command},
	{compare.Spec, compare.Command},
	{proof.Spec, proof.Command},
}

func specs() []cli.Spec {
	out := make([]cli.Spec, len(commands))
	for i, c := range commands {
		out[i] = c.spec
	}
	return out
}

// usageFooter follows the commands in `scorer -h`.
const usageFooter = `Run 'scorer <command> -h' for the command's flags and the settings it reads.
Settings come from environment variables, each also a flag of the commands
that read it, which wins (docs/configuration.md).

Signals: on SIGINT/SIGTERM, run stops fetching, drains in-flight work and
exits 0; score stops at once and exits 130, leaving a file --out as it was
(with --resume, the transcripts completed so far stay in --out's .partial file).
A second signal kills the process.
`

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	e := cli.Env{Getenv: getenv, Stdin: stdin, Stdout: stdout, Stderr: stderr}
	usage := cli.Usage(specs(), usageFooter)
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return cli.ErrUsage
	}
	name, rest := args[0], args[1:]
	for _, c := range commands {
		if c.spec.Name == name {
			return c.run(ctx, e, rest)
		}
	}
	switch name {
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usage)
		return nil
	}
	fmt.Fprintf(stderr, "scorer: unknown command %q\n\n%s", name, usage)
	return cli.ErrUsage
}
