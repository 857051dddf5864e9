package bench

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/scorer/scorer/internal/config"
)

// procResult is one child's wall time, CPU time (getrusage of the reaped
// child) and peak resident set (its VmHWM, polled while it runs).
type procResult struct {
	seconds, cpuSeconds float64
	peakRSSMiB          float64
	stdout              []byte
}

// runProc runs a command to completion and measures it.
func runProc(ctx context.Context, env []string, name string, args ...string) (procResult, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(os.Environ(), env...)
	var out bytes.Buffer
	errb := &tailLog{}
	cmd.Stdout, cmd.Stderr = &out, errb
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return procResult{}, fmt.Errorf("%s: %w", filepath.Base(name), err)
	}
	// The peak resident set is polled from /proc/PID/status (VmHWM, the
	// child's own address space once it has exec'd, which Start waits
	// for), not taken from wait4's ru_maxrss: Go starts children with
	// vfork, and Linux carries the parent's high-water mark across exec
	// into ru_maxrss, so every child smaller than this process reported
	// this process's peak.
	stopPeak := watchPeak(cmd.Process.Pid, peakPoll)
	err := cmd.Wait()
	d := time.Since(t0)
	hwmKiB := stopPeak()
	if err != nil {
		return procResult{}, fmt.Errorf("%s %s: %w: %s", filepath.Base(name), strings.Join(args, " "), err, errb.String())
	}
	r := procResult{seconds: d.Seconds(), stdout: out.Bytes(), peakRSSMiB: float64(hwmKiB) / 1024}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.cpuSeconds = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	return r, nil
}

// peakPoll is how often runProc reads a child's peak resident set; a rise
// in the child's last peakPoll before it exits can be missed.
const peakPoll = 20 * time.Millisecond

// readyzRun starts `scorer run` on the in-memory broker with env and
// returns the seconds from exec until /readyz answers ready (model loaded,
// broker reachable, group joined), then stops it with SIGTERM.
func readyzRun(ctx context.Context, env []string, exe string) (float64, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.CommandContext(ctx, exe, "run")
	cmd.Env = append(append(os.Environ(), env...), "KAFKA_BROKERS=embedded", "METRICS_ADDR="+addr)
	errb := &tailLog{}
	cmd.Stdout, cmd.Stderr = errb, errb
	t0 := time.Now()
	if err := cmd.Start(); err != nil {
		return 0, fmt.Errorf("scorer run: %w", err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	stop := func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(time.Minute):
			_ = cmd.Process.Kill()
			<-exited
		}
	}
	client := &http.Client{Timeout: time.Second}
	for {
		select {
		case err := <-exited:
			return 0, fmt.Errorf("scorer run exited before it was ready: %v: %s", err, errb.String())
		case <-ctx.Done():
			stop()
			return 0, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
		resp, err := client.Get("http://" + addr + "/readyz")
		if err != nil {
			continue
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK {
			d := time.Since(t0)
			stop()
			return d.Seconds(), nil
		}
	}
}

// rawLoopRun runs the raw loop on input file in, as o's scorer runs.
func rawLoopRun(ctx context.Context, o wholeProcOpts, in string) (procResult, error) {
	return runProc(ctx, nil, "node", o.rawLoop, "--model", o.dir, "--model-file", o.graph, "--in", in,
		"--labels", strings.Join(o.cfg.Labels, ","), "--template", o.cfg.HypothesisTemplate)
}

// findRawLoop returns tools/rawloop/rawloop.mjs when node and the loop's
// npm packages are installed (`make bench` installs them), else why not.
func findRawLoop() (string, string) {
	if _, err := exec.LookPath("node"); err != nil {
		return "", "node is not on PATH"
	}
	script, err := config.ResolvePath("tools/rawloop/rawloop.mjs")
	if err != nil {
		return "", "tools/rawloop/rawloop.mjs not found"
	}
	if _, err := os.Stat(filepath.Join(filepath.Dir(script), "node_modules", "onnxruntime-node")); err != nil {
		return "", "tools/rawloop has no node_modules (run `make rawloop`)"
	}
	return script, ""
}

// rawLoopOnce is findRawLoop's answer, asked (and a missing loop said)
// once per run for both whole-process sections.
func (b *benchRun) rawLoopOnce() (path, note string) {
	if !b.rawLooked {
		b.rawLoop, b.rawNote = findRawLoop()
		b.rawLooked = true
		if b.rawNote != "" {
			progress(b.e, "whole process: no raw loop (%s); scorer score rows only", b.rawNote)
		}
	}
	return b.rawLoop, b.rawNote
}
