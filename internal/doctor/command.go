package doctor

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/scoring"
)

// Command is `scorer doctor`: it parses the service's configuration plus
// its own flags and hands the check to Run. It exits 0 when the
// configured DEVICE works here as configured (auto on a CPU-only host
// included) and 1, with the cause, when it does not.
func Command(ctx context.Context, e cli.Env, args []string) error {
	fs := flag.NewFlagSet("doctor", flag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	asJSON := fs.Bool("json", false, "print the report as JSON")
	duration := fs.Duration("duration", 3*time.Second, "length of each device's throughput run")
	cfg, err := config.Load(e.Getenv, fs, args)
	if err != nil {
		return cli.UsageOr(err)
	}
	if *duration <= 0 {
		return cli.UsageError{Msg: "doctor: --duration must be > 0"}
	}
	// The pool's own lines would interleave with the report; warnings show.
	log, err := cli.NewLogger(e.Stderr, "warn", cfg.LogFormat)
	if err != nil {
		return err
	}
	lib, err := cli.ResolvePath(cfg.ORTLib)
	if err != nil {
		return fmt.Errorf("doctor: ORT_LIB: %w (run `make` to fetch ONNX Runtime, or point ORT_LIB at libonnxruntime.so.1)", err)
	}
	lo, err := config.ModelOptions(cfg)
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	devMode, err := gpupool.ParseDeviceMode(cfg.Device)
	if err != nil {
		return err
	}
	memLimit, err := gpupool.ParseMemLimit(cfg.GPUMemLimit)
	if err != nil {
		return fmt.Errorf("GPU_MEM_LIMIT: %w", err)
	}
	workers, threads := config.CPUPlan(cfg)
	if devMode != gpupool.ModeCPU {
		scoring.PCIBusOrder(log) // as the service does, so the mapping shown is the one it uses
	}
	rep, err := Run(ctx, Options{
		ORTLib: lib, Model: lo, Device: devMode, GPUIDs: cfg.GPUIDs,
		MemFraction: cfg.GPUMemFraction, MemLimit: memLimit, TF32: cfg.GPUTF32,
		Template: cfg.HypothesisTemplate, Labels: cfg.Labels, Threshold: cfg.Threshold,
		MaxBatchTokens: cfg.MaxBatchTokens, MaxBatchRows: cfg.MaxBatchRows,
		CPUWorkers: workers, CPUThreads: threads, Duration: *duration,
		// CUDA reads the real environment, so the mapping must too.
		LookupEnv: os.LookupEnv, Log: log,
	})
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	if ctx.Err() != nil {
		return cli.ErrInterrupted
	}
	if *asJSON {
		err = WriteJSON(e.Stdout, rep)
	} else {
		err = WriteText(e.Stdout, rep)
	}
	if err != nil {
		return err
	}
	if !rep.OK {
		return fmt.Errorf("%w: %s", ErrNotOK, rep.Verdict)
	}
	return nil
}
