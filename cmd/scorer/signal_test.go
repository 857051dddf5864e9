package main

import (
	"bytes"
	"errors"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/testenv"
)

// TestScoreSIGTERM is `scorer score`'s signal contract on the built binary:
// SIGTERM while it waits on stdin stops it at once with exit 130. The
// in-process half (cancel while waiting on stdin) is in internal/offline.
func TestScoreSIGTERM(t *testing.T) {
	env := testenv.ScorerEnv(t)
	cmd := exec.Command(scorerBinary(t), "score", "--progress", "on")
	cmd.Env = environ(env)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stdin.Close() })
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	// The progress line is drawn once the stack is open, so the signal
	// arrives while score waits on stdin rather than during start-up.
	running := make(chan struct{})
	go func() {
		var log bytes.Buffer
		buf := make([]byte, 4096)
		for seen := false; ; {
			n, err := stderr.Read(buf)
			log.Write(buf[:n])
			if !seen && strings.Contains(log.String(), "transcripts scored") {
				seen = true
				close(running)
			}
			if err != nil {
				return
			}
		}
	}()
	select {
	case <-running:
	case <-time.After(60 * time.Second):
		t.Fatal("no progress line within 60s")
	}
	start := time.Now()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 130 {
			t.Errorf("exit: %v, want status 130", err)
		}
		t.Logf("exited %v after SIGTERM", time.Since(start).Round(time.Millisecond))
	case <-time.After(20 * time.Second):
		t.Fatal("scorer score still running 20s after SIGTERM")
	}
}
