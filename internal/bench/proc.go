package bench

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// tailLog keeps the last bytes a child process wrote, for error messages:
// a failed child must say why without the benchmark holding its whole log.
type tailLog struct {
	mu  sync.Mutex
	buf []byte
}

func (t *tailLog) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - 8192; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(p), nil
}

func (t *tailLog) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// watchPeak polls process pid's peak resident set (VmHWM) every interval
// until stop is called; stop reads it once more, where the process still
// exists, and returns the largest reading in KiB (0 when none succeeded).
// A rise in the process's last interval before it exits can be missed.
func watchPeak(pid int, every time.Duration) (stop func() int64) {
	peak := make(chan int64, 1)
	done := make(chan struct{})
	go func() {
		var hwm int64
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			if m, err := readProcMemory(pid); err == nil {
				hwm = max(hwm, m.HWMKiB)
			}
			select {
			case <-done:
				if m, err := readProcMemory(pid); err == nil {
					hwm = max(hwm, m.HWMKiB)
				}
				peak <- hwm
				return
			case <-tick.C:
			}
		}
	}()
	return func() int64 {
		close(done)
		return <-peak
	}
}

// child is a scorer subcommand running as its own process.
type child struct {
	cmd  *exec.Cmd
	log  *tailLog
	done chan struct{} // closed when the process has exited and been reaped
}

// startChild runs this binary with args and env added to ours. Its stdout
// lines go to lines (if not nil), everything else to a tail log.
func startChild(env []string, lines chan<- string, args ...string) (*child, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(exe, args...)
	cmd.Env = append(os.Environ(), env...)
	c := &child{cmd: cmd, log: &tailLog{}, done: make(chan struct{})}
	cmd.Stderr = c.log
	var stdout io.ReadCloser
	if lines != nil {
		if stdout, err = cmd.StdoutPipe(); err != nil {
			return nil, err
		}
	} else {
		cmd.Stdout = c.log
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: starting %s: %w", args[0], err)
	}
	if stdout != nil {
		go func() {
			sc := bufio.NewScanner(stdout)
			for sc.Scan() {
				select {
				case lines <- sc.Text():
				default: // nobody listens any more; keep draining the pipe
				}
			}
		}()
	}
	go func() { _ = cmd.Wait(); close(c.done) }()
	return c, nil
}

// stop sends SIGTERM, waits up to grace, then kills. It only ever signals
// the process it started.
func (c *child) stop(grace time.Duration) {
	select {
	case <-c.done:
		return
	default:
	}
	_ = c.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(grace):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// startBrokerChild runs `scorer broker` on a free port and returns its
// address. A separate process keeps the broker's CPU and memory out of the
// measured scorer.
func startBrokerChild(ctx context.Context, partitions int) (*child, string, error) {
	lines := make(chan string, 16)
	c, err := startChild(nil, lines, "broker", "--addr", "127.0.0.1:0", "--partitions", strconv.Itoa(partitions), "--log-level", "warn")
	if err != nil {
		return nil, "", err
	}
	timeout := time.After(30 * time.Second)
	for {
		select {
		case l := <-lines:
			if a, ok := strings.CutPrefix(l, "broker listening on "); ok {
				return c, a, nil
			}
		case <-c.done:
			return nil, "", fmt.Errorf("bench: broker exited: %s", c.log.String())
		case <-timeout:
			c.stop(time.Second)
			return nil, "", fmt.Errorf("bench: broker did not report its address in 30s: %s", c.log.String())
		case <-ctx.Done():
			c.stop(time.Second)
			return nil, "", ctx.Err()
		}
	}
}

// procMemory is what /proc/PID/status says about a process's resident set.
type procMemory struct {
	HWMKiB, RSSKiB int64
}

// readProcMemory reads VmHWM (peak resident set) and VmRSS of pid.
func readProcMemory(pid int) (procMemory, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return procMemory{}, err
	}
	var m procMemory
	for _, line := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		f := strings.Fields(v)
		if len(f) == 0 {
			continue
		}
		n, _ := strconv.ParseInt(f[0], 10, 64)
		switch k {
		case "VmHWM":
			m.HWMKiB = n
		case "VmRSS":
			m.RSSKiB = n
		}
	}
	return m, nil
}

// freePort asks the kernel for a free TCP port on localhost. Another
// process may take it before we use it; on this benchmark machine that race
// is harmless and the child would fail loudly.
func freePort() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// scrapeMetric returns the sum of a Prometheus metric's samples (all label
// sets) from a /metrics endpoint's text, or -1 when it is absent.
func scrapeMetric(text []byte, name string) float64 {
	sum, found := 0.0, false
	sc := bufio.NewScanner(bytes.NewReader(text))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		if rest == "" || (rest[0] != ' ' && rest[0] != '{') {
			continue // a longer name with this prefix
		}
		f := strings.Fields(rest[strings.LastIndex(rest, "}")+1:])
		if len(f) == 0 {
			continue
		}
		if v, err := strconv.ParseFloat(f[0], 64); err == nil {
			sum += v
			found = true
		}
	}
	if !found {
		return -1
	}
	return sum
}
