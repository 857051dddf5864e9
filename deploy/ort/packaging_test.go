package ort_test

import (
	"bufio"
	"debug/elf"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model/ortenv"
)

// pin is one row of pins.txt.
type pin struct{ set, pkg, inner, name, sha string }

// readPins returns the rows of one set of pins.txt.
func readPins(t *testing.T, set string) []pin {
	t.Helper()
	var pins []pin
	for _, line := range readLines(t, "pins.txt") {
		f := strings.Fields(line)
		if len(f) != 5 {
			t.Fatalf("pins.txt: row %q has %d fields, want 5", line, len(f))
		}
		if f[0] == set {
			pins = append(pins, pin{f[0], f[1], f[2], f[3], f[4]})
		}
	}
	if len(pins) == 0 {
		t.Fatalf("pins.txt has no %s set", set)
	}
	return pins
}

// readLines returns a list file's lines without comments and blanks.
func readLines(t *testing.T, path string) []string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if l := strings.TrimSpace(sc.Text()); l != "" && !strings.HasPrefix(l, "#") {
			out = append(out, l)
		}
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// TestCUDAPackaging runs the CUDA image's exact ONNX Runtime files (`make
// cuda-ort`) as far as a machine without CUDA can: the directory holds
// exactly the pinned files with the pinned bytes; the core is a CUDA-capable
// build (its C API lists CUDAExecutionProvider); CUDA provider options are
// created; appending the CUDA provider loads the provider libraries and
// stops only where the CUDA runtime, the driver or a device is missing,
// with an error naming it (never "not enabled in this build", never a
// missing provider file); and every library the shipped files link is one
// the CUDA base image provides (cuda-base-libs.txt) or a shipped file.
func TestCUDAPackaging(t *testing.T) {
	dir := testenv.ORTCUDADir(t)
	pins := readPins(t, "cuda")
	var core pin
	for _, p := range pins {
		if p.name == "libonnxruntime.so.1" {
			core = p
		}
	}

	t.Run("exact files", func(t *testing.T) {
		entries, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		var got, want []string
		for _, e := range entries {
			got = append(got, e.Name())
		}
		for _, p := range pins {
			want = append(want, p.name)
			if sum := testenv.SHA256File(t, filepath.Join(dir, p.name)); sum != p.sha {
				t.Errorf("%s: SHA-256 %s, pinned %s", p.name, sum, p.sha)
			}
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("%s holds %v, want exactly the pinned %v", dir, got, want)
		}
	})

	t.Run("NEEDED in base image", func(t *testing.T) {
		base := readLines(t, "cuda-base-libs.txt")
		var shipped []string
		for _, p := range pins {
			shipped = append(shipped, p.name)
		}
		needs := map[string]bool{}
		for _, p := range pins {
			f, err := elf.Open(filepath.Join(dir, p.name))
			if err != nil {
				t.Fatalf("%s: %v", p.name, err)
			}
			libs, err := f.ImportedLibraries()
			f.Close()
			if err != nil {
				t.Fatalf("%s: reading NEEDED: %v", p.name, err)
			}
			if len(libs) == 0 {
				t.Errorf("%s: no NEEDED entries read", p.name)
			}
			for _, l := range libs {
				needs[l] = true
				if !slices.Contains(base, l) && !slices.Contains(shipped, l) {
					t.Errorf("%s needs %s, which neither the CUDA base image (cuda-base-libs.txt) nor the shipped files provide", p.name, l)
				}
			}
		}
		// The provider is what needs CUDA: if it stopped linking the CUDA
		// runtime, this list (and the base image choice) is stale.
		for _, l := range []string{"libcudart.so.13", "libcublasLt.so.13", "libcuda.so.1"} {
			if !needs[l] {
				t.Errorf("no shipped file needs %s; update cuda-base-libs.txt and the CUDA base image", l)
			}
		}
	})

	t.Run("core lists CUDA", func(t *testing.T) {
		info, err := ortenv.ProbeRuntime(filepath.Join(dir, "libonnxruntime.so.1"))
		if err != nil {
			t.Fatal(err)
		}
		if !info.HasProvider("CUDAExecutionProvider") || !info.HasProvider("CPUExecutionProvider") {
			t.Errorf("core lists %v, want CUDAExecutionProvider and CPUExecutionProvider", info.Providers)
		}
		if _, v, _ := strings.Cut(core.pkg, "@"); info.Version != v {
			t.Errorf("core says version %q, pinned package %s", info.Version, core.pkg)
		}
	})

	t.Run("append CUDA", func(t *testing.T) {
		shutdown, err := ortenv.InitRuntime(filepath.Join(dir, "libonnxruntime.so.1"))
		if err != nil {
			t.Fatal(err)
		}
		defer shutdown()
		err = gpupool.CheckCUDA(gpupool.Device{Kind: gpupool.CUDA, Index: 0}, gpupool.SessionConfig{})
		if err == nil {
			// A machine with CUDA and a GPU: the provider loaded, which is
			// the goal; nothing below can be checked.
			t.Log("CUDA provider appended: this machine has a CUDA runtime, driver and device")
			return
		}
		t.Logf("append CUDA: %v", err)
		if strings.Contains(err.Error(), "not enabled in this build") {
			t.Fatalf("the shipped core has no CUDA provider: %v", err)
		}
		var p *ortenv.CUDAProblem
		if !errors.As(err, &p) {
			t.Fatalf("append CUDA failed with an undiagnosed error: %v", err)
		}
		switch p.Kind {
		case ortenv.ProblemCUDARuntime, ortenv.ProblemNoDriver, ortenv.ProblemNoDevice:
		default:
			t.Fatalf("append CUDA failed with %s (%s), want only a missing CUDA runtime, driver or device", p.Kind, p.Cause)
		}
		if p.Kind == ortenv.ProblemCUDARuntime {
			named := false
			for _, l := range readLines(t, "cuda-base-libs.txt") {
				named = named || strings.Contains(p.Cause, l)
			}
			if !named {
				t.Errorf("cause %q names no library of the CUDA base image", p.Cause)
			}
		}
	})
}
