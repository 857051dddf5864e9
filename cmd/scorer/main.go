// Command scorer scores earnings-call transcripts with a zero-shot NLI model.
//
//	scorer run       the streaming service: Kafka in → scored → Kafka out
//	scorer score     offline: TranscriptEvent JSONL in, ScoredTranscript JSONL out
//	scorer broker    an in-memory Kafka-protocol broker, for development and tests
//	scorer produce   load a TranscriptEvent JSONL file into a topic
//	scorer bench     benchmarks (see docs/benchmarks.md)
//	scorer doctor    whether the configured DEVICE works on this host (see docs/gpu.md)
//	scorer compare   two models on one sample: |Δp|, decision agreement, speed
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

const usageText = `usage: scorer <command> [flags]

commands:
  run       consume TranscriptEvents, score them, publish ScoredTranscripts
  score     score a TranscriptEvent JSONL file offline (--in, --out)
  broker    run an in-memory Kafka-protocol broker (not durable)
  produce   load a TranscriptEvent JSONL file into a topic
  bench     run the benchmarks
  doctor    check this host's GPU/CPU path for the configured DEVICE (--json)
  compare   score a sample with two models (or ONNX files, or devices) and gate on agreement
  gpu-proof the GPU measurements of "make gpu-proof": bench, share, report (docs/gpu.md)

Run 'scorer <command> -h' for the command's flags. Configuration comes from
environment variables (see README.md); flags override them.

Signals: on SIGINT/SIGTERM, run stops fetching, drains in-flight work and
exits 0; score stops at once and exits 130, leaving a file --out as it was
(with --resume, the transcripts completed so far stay in --out's .partial file).
A second signal kills the process.
`

func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	e := cli.Env{Getenv: getenv, Stdin: stdin, Stdout: stdout, Stderr: stderr}
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return cli.ErrUsage
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "run":
		return service.Command(ctx, e, rest)
	case "score":
		return offline.Command(ctx, e, rest)
	case "broker":
		return broker.Command(ctx, e, rest)
	case "produce":
		return produce.Command(ctx, e, rest)
	case "bench":
		return bench.Command(ctx, e, rest)
	case "doctor":
		return doctor.Command(ctx, e, rest)
	case "compare":
		return compare.Command(ctx, e, rest)
	case "gpu-proof":
		return proof.Command(ctx, e, rest)
	case "-h", "--help", "help":
		fmt.Fprint(stdout, usageText)
		return nil
	default:
		fmt.Fprintf(stderr, "scorer: unknown command %q\n\n%s", cmd, usageText)
		return cli.ErrUsage
	}
}
