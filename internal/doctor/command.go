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

// Spec is `scorer doctor` for its help and the docs.
var Spec = cli.Spec{
	Name: "doctor", Synopsis: "[--json] [flags]",
	Summary: "check this host's GPU/CPU path for the configured DEVICE (docs/gpu.md)",
	About: "Whether the configured DEVICE works on this host: ONNX Runtime's providers and the CUDA libraries, " +
		"the driver and its GPUs as CUDA numbers them (MIG included), a CUDA session per GPU with CPU parity, the " +
		"calibrated memory model, and a short throughput run on each device in the pools the service builds from " +
		"the settings below; without a GPU, the CPU path and why. Exit 0 when DEVICE works as configured, 1 with " +
		"the cause. docs/gpu.md explains every line.",
	Settings: config.Doctor,
	Flags:    func(fs *flag.FlagSet) { new(doctorFlags).register(fs) },
}

// doctorFlags are `scorer doctor`'s own flags.
type doctorFlags struct {
	asJSON   bool
	duration time.Duration
	budget   time.Duration
}

func (f *doctorFlags) register(fs *flag.FlagSet) {
	fs.BoolVar(&f.asJSON, "json", false, "print the report as JSON")
	fs.DurationVar(&f.duration, "duration", 3*time.Second, "longest throughput run on each device")
	fs.DurationVar(&f.budget, "budget", DefaultBudget, "time to answer in: past proving the path works, the rest of the sample, the CPU parity reference, the TF32 comparison and the throughput runs get what is left, and the report lists what was cut")
}

// Command is `scorer doctor`: it parses the service's configuration plus
// its own flags and hands the check to Run. It exits 0 when the
// configured DEVICE works here as configured (auto on a CPU-only host
// included) and 1, with the cause, when it does not.
func Command(ctx context.Context, e cli.Env, args []string) error {
	fs := Spec.FlagSet(e)
	var f doctorFlags
	f.register(fs)
	cfg, err := Spec.Load(e, fs, args)
	if err != nil {
		return err
	}
	if f.duration <= 0 || f.budget <= 0 {
		return cli.UsageError{Msg: "doctor: --duration and --budget must be > 0"}
	}
	// The pool's own lines would interleave with the report.
	log, err := cli.ReportLogger(e, fs, e.Stderr, cfg.LogLevel, cfg.LogFormat)
	if err != nil {
		return err
	}
	lib, err := config.ResolvePath(cfg.ORTLib)
	if err != nil {
		return fmt.Errorf("doctor: ORT_LIB: %w (run `make` to fetch ONNX Runtime, or point ORT_LIB at libonnxruntime.so.1)", err)
	}
	if cfg.Device != string(gpupool.ModeCPU) {
		scoring.PCIBusOrder(log) // as the service does, so the mapping shown is the one it uses
	}
	// CUDA reads the real environment, so the mapping must too.
	rep, err := Run(ctx, Options{Config: cfg, ORTLib: lib, Duration: f.duration, Budget: f.budget, LookupEnv: os.LookupEnv, Log: log})
	if err != nil {
		return fmt.Errorf("doctor: %w", err)
	}
	if ctx.Err() != nil {
		return cli.ErrInterrupted
	}
	if f.asJSON {
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
