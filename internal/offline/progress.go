package offline

import (
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"golang.org/x/term"

	"github.com/scorer/scorer/gpupool"
)

// startProgress redraws one status line on stderr twice a second.
func (j *scoreJob) startProgress() func() {
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(500 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-stop:
				j.drawProgress(true)
				return
			case <-t.C:
				j.drawProgress(false)
			}
		}
	}()
	return func() { close(stop); wg.Wait() }
}

func (j *scoreJob) drawProgress(final bool) {
	elapsed := time.Since(j.started)
	done := j.done.Load()
	stats := j.stack.Pool.Stats()
	rate := float64(stats.Pairs) / max(elapsed.Seconds(), 1e-9)
	line := fmt.Sprintf("\r%d transcripts scored, %d pairs, %.0f pairs/s, %s", done, stats.Pairs, rate, elapsed.Truncate(time.Second))
	if frac := j.src.progress(); frac > 0 && !final {
		// Reading runs at most a few chunks ahead, so the input read tracks progress.
		eta := time.Duration(float64(elapsed) * (1 - frac) / frac)
		line += fmt.Sprintf(", %3.0f%%, ETA %s", 100*frac, eta.Truncate(time.Second))
	}
	if skipped := j.skipped.Load(); skipped > 0 {
		line += fmt.Sprintf(", %d skipped (done before --resume)", skipped)
	}
	if bad := j.bad.Load(); bad > 0 {
		line += fmt.Sprintf(", %d bad records", bad)
	}
	if len(stats.GPUBusy) > 0 {
		line += ", GPU busy " + busyText(stats.GPUBusy)
	}
	j.stderrMu.Lock()
	defer j.stderrMu.Unlock()
	fmt.Fprintf(j.stderr, "%s\x1b[K", line)
	if final {
		fmt.Fprintln(j.stderr)
	}
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// busyText says how busy each GPU was over the run, "cuda:0 87%", so a run
// shows how much of its time the GPU sat idle (tokenising, copies, waiting
// for a batch). A GPU with no reading yet, or one NVML cannot read (MIG),
// says so rather than 0%.
func busyText(busy []gpupool.GPUBusy) string {
	parts := make([]string, len(busy))
	for i, b := range busy {
		r, ok := b.Ratio()
		switch {
		case ok:
			parts[i] = fmt.Sprintf("%s %.0f%%", b.Device.Label(), 100*r)
		case b.Unsupported:
			parts[i] = b.Device.Label() + " not readable (NVML)"
		default:
			parts[i] = b.Device.Label() + " not sampled yet"
		}
	}
	return strings.Join(parts, ", ")
}
