package proof

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/compare"
	"github.com/scorer/scorer/internal/scoring"
)

// Share is one scorer's run while another shares its GPU.
type Share struct {
	Name          string  `json:"name"`
	Model         string  `json:"model"`
	GPUMemLimit   string  `json:"gpu_mem_limit"`
	Transcripts   int     `json:"transcripts"`
	Pairs         uint64  `json:"pairs"`
	Seconds       float64 `json:"seconds"`
	PairsPerSec   float64 `json:"pairs_per_second"`
	MeanBatchRows float64 `json:"mean_batch_rows"`
	Padding       float64 `json:"padding_efficiency"`
	OOMRetries    uint64  `json:"oom_retries"`
	Refusals      uint64  `json:"refusals"`
	Fallbacks     uint64  `json:"cpu_fallbacks"`
	RunErrors     uint64  `json:"run_errors"`
	// DevicePeakUsed and DeviceTotal are the whole GPU's used memory at its
	// highest during the run (both scorers and anything else) and its size.
	DevicePeakUsed uint64 `json:"device_peak_used_bytes"`
	DeviceTotal    uint64 `json:"device_total_bytes"`
	Error          string `json:"error,omitempty"`
}

// shareFlags are `scorer gpu-proof share`'s own flags.
type shareFlags struct {
	out, in, name string
	limit         int
}

func (f *shareFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.out, "out", "", "write the JSON result here (required)")
	fs.StringVar(&f.in, "in", "", "TranscriptEvent JSONL (required)")
	fs.IntVar(&f.limit, "limit", 50, "transcripts to score")
	fs.StringVar(&f.name, "name", "scorer", "this scorer's name in the report")
}

// shareCommand scores real transcripts through the service's own pool
// (DEVICE, GPU_MEM_LIMIT, MAX_BATCH_TOKENS… as configured) and records what
// shows whether it coexisted with another scorer: OOM retries, admission
// refusals, CPU fallbacks, and the device's peak.
func shareCommand(ctx context.Context, e cli.Env, args []string) error {
	fs := shareSpec.FlagSet(e)
	var f shareFlags
	f.register(fs)
	cfg, err := shareSpec.Load(e, fs, args)
	if err != nil {
		return err
	}
	if f.out == "" || f.in == "" {
		return cli.UsageError{Msg: "gpu-proof share: --out and --in are required"}
	}
	file, err := os.Open(f.in)
	if err != nil {
		return fmt.Errorf("gpu-proof: %w", err)
	}
	events, err := compare.ReadEvents(file, cfg.Limits(), f.limit)
	file.Close()
	if err != nil {
		return err
	}
	m, probe, rt, err := open(ctx, cfg)
	if err != nil {
		return err
	}
	defer rt.Close()
	res := Share{Name: f.name, Model: m.Name + " " + m.SHA256[:12], GPUMemLimit: cfg.GPUMemLimit, Transcripts: len(events)}
	// Device-wide peak, polled: it is the neighbour's and ours together.
	// Only the poller writes peak and res.DeviceTotal; they are read after
	// stopPoll has waited for it.
	var peak uint64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	stopPoll := sync.OnceFunc(func() {
		close(stop)
		wg.Wait()
	})
	defer stopPoll()
	wg.Go(func() {
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		for {
			if _, used, total, err := probe.MemoryInfo(0); err == nil {
				res.DeviceTotal = total
				peak = max(peak, used)
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	})
	log := zerolog.New(e.Stderr).With().Timestamp().Str("scorer", f.name).Logger().Level(zerolog.WarnLevel)
	// The service's stack on the Runtime's NVML, without the score cache:
	// every pair reaches the GPU, as the throughput compared assumes.
	stack, err := scoring.Open(ctx, cfg, log, nil, scoring.OnRuntime(rt), scoring.WithModel(m), scoring.NoCache())
	if err != nil {
		return err
	}
	pool, ts := stack.Pool, stack.Scorer
	start := time.Now()
	_, err = ts.Score(ctx, events)
	res.Seconds = time.Since(start).Seconds()
	stopPoll()
	if err != nil {
		res.Error = err.Error()
	}
	st := pool.Stats()
	_ = stack.Close(context.Background())
	res.Pairs, res.OOMRetries, res.Refusals, res.Fallbacks, res.RunErrors = st.Pairs, st.OOMRetries, st.Refusals, st.Fallbacks, st.RunErrors
	res.PairsPerSec = float64(st.Pairs) / res.Seconds
	if st.Batches > 0 {
		res.MeanBatchRows = float64(st.Pairs) / float64(st.Batches)
	}
	res.Padding = st.PaddingEfficiency()
	res.DevicePeakUsed = peak
	if werr := writeJSON(f.out, res); werr != nil {
		return werr
	}
	if err != nil {
		return fmt.Errorf("gpu-proof share: %w", err)
	}
	return nil
}
