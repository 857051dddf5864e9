package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/dist"
	"github.com/scorer/scorer/internal/testenv"
)

// TestBundle builds the portable GPU bundle as `make dist` does, unpacks it
// into a temporary folder and runs it from there as a user would, with no
// ORT_LIB from the build: its SHA256SUMS hold; its launcher points ORT_LIB
// at the bundle's CUDA set (so the provider libraries load, and what stops
// the GPU here is the missing CUDA runtime, named); it takes cuDNN from a
// Python environment's NVIDIA wheel folder, and the doctor names that file;
// DEVICE=auto scores on the CPU saying why, DEVICE=cuda fails with the
// cause.
func TestBundle(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and a bundle of the CUDA set, then runs it; make test runs it")
	}
	root := testenv.RepoRoot()
	ortDir := testenv.ORTCUDADir(t)
	work := t.TempDir()
	bin := buildScorer(t)
	// `make dist`'s command, built without the race detector: compressing the ~270 MB CUDA set
	// in this -race test binary took two thirds of the test's CPU.
	build := exec.Command("go", "run", "./tools/dist", "-version", "test", "-binary", bin, "-ort", ortDir,
		"-launcher", filepath.Join(root, "deploy/dist/scorer"), "-readme", filepath.Join(root, "deploy/dist/README.md"),
		"-out", filepath.Join(work, "dist"), "-level", "fastest")
	build.Dir = root
	stdout, err := build.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("tools/dist: %v\n%s (run `make cuda-ort`)", err, stderr)
	}
	archive := strings.TrimSpace(string(stdout))
	if filepath.Base(archive) != "scorer-test-linux-amd64-cuda.tar.zst" {
		t.Errorf("archive %s", archive)
	}
	dir, err := dist.Extract(archive, filepath.Join(work, "unpacked"))
	if err != nil {
		t.Fatal(err)
	}
	check := exec.Command("sha256sum", "--strict", "-c", "SHA256SUMS")
	check.Dir = dir
	if out, err := check.CombinedOutput(); err != nil {
		t.Fatalf("sha256sum -c SHA256SUMS in the bundle: %v\n%s", err, out)
	}
	sums, _ := os.ReadFile(filepath.Join(dir, "SHA256SUMS"))
	for _, want := range []string{"bin/scorer", "libexec/scorer", "README.md", "lib/onnxruntime/libonnxruntime.so.1",
		"lib/onnxruntime/libonnxruntime_providers_shared.so", "lib/onnxruntime/libonnxruntime_providers_cuda.so"} {
		if !strings.Contains(string(sums), "  "+want+"\n") {
			t.Errorf("SHA256SUMS lacks %s:\n%s", want, sums)
		}
	}

	// A Python environment with NVIDIA's cuDNN wheel: its site-packages
	// holds nvidia/cudnn/lib/libcudnn.so.9 (here a stand-in library, as
	// the loader only needs an ELF file). python3 on PATH answers
	// site.getsitepackages() with it, as a venv's would.
	site := filepath.Join(work, "venv", "lib", "python3.12", "site-packages")
	cudnnDir := filepath.Join(site, "nvidia", "cudnn", "lib")
	if err := os.MkdirAll(cudnnDir, 0o755); err != nil {
		t.Fatal(err)
	}
	stand, err := exec.Command("sh", "-c", "ldconfig -p | awk '/libz.so.1 .*x86-64/ {print $NF; exit}'").Output()
	if err != nil || len(strings.TrimSpace(string(stand))) == 0 {
		t.Fatalf("no libz.so.1 to stand in for cuDNN: %v", err)
	}
	lib, err := os.ReadFile(strings.TrimSpace(string(stand)))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cudnnDir, "libcudnn.so.9"), lib, 0o755); err != nil {
		t.Fatal(err)
	}
	pybin := filepath.Join(work, "venv", "bin")
	if err := os.MkdirAll(pybin, 0o755); err != nil {
		t.Fatal(err)
	}
	py := "#!/bin/sh\necho " + site + "\n"
	if err := os.WriteFile(filepath.Join(pybin, "python3"), []byte(py), 0o755); err != nil {
		t.Fatal(err)
	}

	doctor := func(device string) (map[string]any, string, error) {
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(dir, "bin", "scorer"), "doctor", "--json", "--duration", "200ms")
		cmd.Dir = work
		cmd.Env = []string{"PATH=" + pybin + ":/usr/bin:/bin", "HOME=" + work, "DEVICE=" + device,
			"MODEL_DIR=" + testenv.ModelDir(t, "nli-unigram-small"), "LOG_FORMAT=json"}
		var stderr strings.Builder
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var rep map[string]any
		if jerr := json.Unmarshal(out, &rep); jerr != nil {
			t.Fatalf("DEVICE=%s: doctor output is not JSON (%v; exit %v):\n%s\n%s", device, jerr, err, out, stderr.String())
		}
		return rep, stderr.String(), err
	}
	rep, stderr, err := doctor("auto")
	if err != nil {
		t.Fatalf("DEVICE=auto from the bundle: %v\n%s", err, stderr)
	}
	ort := rep["onnxruntime"].(map[string]any)
	if lib := ort["library"].(string); lib != filepath.Join(dir, "lib", "onnxruntime", "libonnxruntime.so.1") {
		t.Errorf("ORT library %s, want the bundle's", lib)
	}
	prob, _ := ort["cuda_problem"].(map[string]any)
	if prob == nil || prob["kind"] != "missing_cuda_runtime" || !strings.Contains(prob["cause"].(string), "libcublasLt.so.13") {
		t.Errorf("CUDA provider problem %v, want missing_cuda_runtime naming libcublasLt.so.13 (the provider files are in the bundle)", prob)
	}
	if rep["ok"] != true || rep["path"] != "cpu" || !strings.Contains(rep["verdict"].(string), "scores on the CPU here (no usable GPU: ") {
		t.Errorf("DEVICE=auto: ok %v path %v verdict %q", rep["ok"], rep["path"], rep["verdict"])
	}
	var cudnn map[string]any
	for _, l := range rep["cuda_libraries"].([]any) {
		if m := l.(map[string]any); m["name"] == "libcudnn.so.9" {
			cudnn = m
		}
	}
	if cudnn == nil || cudnn["path"] != filepath.Join(cudnnDir, "libcudnn.so.9") || cudnn["from"] != "python wheel" {
		t.Errorf("libcudnn.so.9: %v, want found in the Python environment's nvidia/cudnn/lib", cudnn)
	}

	rep, _, err = doctor("cuda")
	if err == nil || rep["ok"] != false || !strings.HasPrefix(rep["verdict"].(string), "FAIL: DEVICE=cuda cannot work here: ") {
		t.Errorf("DEVICE=cuda without a GPU: %v, verdict %q; want exit 1 with the cause", err, rep["verdict"])
	}

	// The bundle's README says how to run it; the archive's checksum file
	// names the archive.
	readme, _ := os.ReadFile(filepath.Join(dir, "README.md"))
	if !strings.Contains(string(readme), "bin/scorer doctor") {
		t.Error("bundle README does not say how to check the host")
	}
	f, err := os.Open(archive + ".sha256")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() || !strings.HasSuffix(sc.Text(), "  "+filepath.Base(archive)) {
		t.Errorf("%s.sha256: %q", archive, sc.Text())
	}
}
