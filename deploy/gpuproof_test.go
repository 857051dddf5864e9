package deploy

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/testenv"
)

// `make gpu-proof` on a host without a GPU stops at once, at its first
// phase, with the doctor's cause and remedy, exit 1: it makes no model,
// runs no comparison or benchmark, and leaves the doctor's report behind.
func TestGPUProofRefusesWithoutGPU(t *testing.T) {
	root := testenv.RepoRoot()
	work := t.TempDir()
	bin := buildScorer(t)
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	out := filepath.Join(work, "out")
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "gpu-proof.sh"), "--scorer", bin, "--out", out, "--work", filepath.Join(work, "models"),
		"--small-model", testenv.ModelDir(t, "nli-unigram-small"))
	cmd.Env = append(os.Environ(), "ORT_LIB="+testenv.ORTLib(t), "OUT=")
	start := time.Now()
	stderr, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 {
		t.Fatalf("gpu-proof without a GPU: %v, want exit 1\n%s", err, stderr)
	}
	msg := string(stderr)
	for _, want := range []string{"gpu-proof: stopped: no GPU path here. FAIL: DEVICE=cuda cannot work here: ", "gpu-proof: remedy: ", ">= 580"} {
		if !strings.Contains(msg, want) {
			t.Errorf("output lacks %q:\n%s", want, msg)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "doctor.json")); err != nil {
		t.Errorf("the doctor's report was not kept: %v", err)
	}
	if left, _ := filepath.Glob(filepath.Join(out, "*-*.json")); len(left) > 0 {
		t.Errorf("phases after the doctor ran: %v", left)
	}
	if _, err := os.Stat(filepath.Join(work, "models")); err == nil {
		if entries, _ := os.ReadDir(filepath.Join(work, "models")); len(entries) > 0 {
			t.Errorf("models were made: %v", entries)
		}
	}
	t.Logf("stopped after %v:\n%s", time.Since(start).Round(time.Second), msg)
}
