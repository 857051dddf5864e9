package main

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// scorer is one `scorer run` process slot: A is never stopped (its RSS and
// goroutines are the drift figures), B is killed and restarted, C and D
// join and leave the group.
type scorer struct {
	name    string
	bin     string
	env     []string
	metrics string // host:port of its /metrics, the same across restarts
	logDir  string
	report  func(format string, args ...any)

	mu       sync.Mutex
	cmd      *exec.Cmd
	done     chan struct{} // closed when the current process has exited
	stopping bool          // the exit was asked for (a fault or the end)
	starts   int
	exits    []string // unasked exits, as the process ended
	lastErr  error    // the last process's exit (nil = 0)
}

func newScorer(name, bin string, env []string, logDir string, report func(string, ...any)) (*scorer, error) {
	addr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	return &scorer{name: name, bin: bin, env: env, metrics: addr, logDir: logDir, report: report}, nil
}

func (s *scorer) start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd != nil {
		return nil
	}
	s.starts++
	log, err := os.Create(filepath.Join(s.logDir, fmt.Sprintf("scorer-%s-%d.log", s.name, s.starts)))
	if err != nil {
		return err
	}
	cmd := exec.Command(s.bin, "run")
	cmd.Env = append(append([]string(nil), s.env...), "METRICS_ADDR="+s.metrics)
	cmd.Stdout, cmd.Stderr = log, log
	if err := cmd.Start(); err != nil {
		log.Close()
		return err
	}
	done := make(chan struct{})
	s.cmd, s.done, s.stopping = cmd, done, false
	go func() {
		err := cmd.Wait()
		log.Close()
		s.mu.Lock()
		s.lastErr = err
		if !s.stopping {
			what := "exit 0"
			if err != nil {
				what = err.Error()
			}
			s.exits = append(s.exits, what)
			s.report("scorer %s (pid %d) exited by itself: %s; log %s", s.name, cmd.Process.Pid, what, log.Name())
		}
		s.cmd = nil
		s.mu.Unlock()
		close(done)
	}()
	return nil
}

func (s *scorer) running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cmd != nil
}

// stop sends sig and waits up to timeout for the exit (then kills it); it
// returns the exit (nil = 0) or why it was not clean.
func (s *scorer) stop(sig syscall.Signal, timeout time.Duration) error {
	s.mu.Lock()
	cmd, done := s.cmd, s.done
	if cmd == nil {
		s.mu.Unlock()
		return nil
	}
	s.stopping = true
	s.mu.Unlock()
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
		return fmt.Errorf("no exit within %v of %v", timeout, sig)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.lastErr
}

// ready reports whether /readyz answers 200.
func (s *scorer) ready() bool {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + s.metrics + "/readyz")
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// sample is one scrape of a scorer's process metrics.
type sample struct {
	rss        float64 // bytes
	goroutines float64
}

func (s *scorer) scrape() (sample, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + s.metrics + "/metrics")
	if err != nil {
		return sample{}, err
	}
	defer resp.Body.Close()
	var out sample
	found := 0
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		name, val, ok := strings.Cut(sc.Text(), " ")
		if !ok {
			continue
		}
		switch name {
		case "process_resident_memory_bytes":
			out.rss, err = strconv.ParseFloat(val, 64)
		case "go_goroutines":
			out.goroutines, err = strconv.ParseFloat(val, 64)
		default:
			continue
		}
		if err != nil {
			return sample{}, fmt.Errorf("%s: %w", name, err)
		}
		found++
	}
	if found != 2 {
		return sample{}, fmt.Errorf("/metrics of %s lacks process_resident_memory_bytes or go_goroutines", s.name)
	}
	return out, sc.Err()
}

// freeAddr is a loopback address nobody listens on right now.
func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

// unasked is a copy of the slot's unasked exits.
func (s *scorer) unasked() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.exits...)
}
