package deploy

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestCgoDeprecationWarningsSilenced keeps a fresh clone's `make build` quiet:
// cgo's wrappers for go-nvml call every function, and nvml.h marks many
// deprecated, so gcc printed ~145 lines of warnings about code we never call.
// The Makefile's CGO_CFLAGS (unless the environment sets its own) is Go's
// default plus -Wno-deprecated-declarations; compiled the way cgo compiles
// go-nvml (its header, its #cgo CFLAGS), a call to a deprecated function
// warns without that switch and is silent with it.
func TestCgoDeprecationWarningsSilenced(t *testing.T) {
	cmd := exec.Command("make", "-C", "..", "-s", "-n", "-p", "build")
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "CGO_CFLAGS=") {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	db, err := cmd.Output()
	if err != nil {
		t.Fatalf("make -n -p build: %v", err)
	}
	m := regexp.MustCompile(`(?m)^CGO_CFLAGS \??= (.*)$`).FindSubmatch(db)
	if m == nil {
		t.Fatal("the Makefile sets no CGO_CFLAGS")
	}
	flags := strings.Fields(string(m[1]))
	if !slices.Contains(flags, "-Wno-deprecated-declarations") || !slices.Contains(flags, "-O2") {
		t.Fatalf("the Makefile's CGO_CFLAGS %q: want Go's default -O2 -g plus -Wno-deprecated-declarations", flags)
	}
	if mk, err := os.ReadFile(makefile); err != nil || !regexp.MustCompile(`(?m)^export CGO_CFLAGS\b`).Match(mk) {
		t.Errorf("the Makefile does not export CGO_CFLAGS to go build (err %v)", err)
	}

	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/NVIDIA/go-nvml").Output()
	if err != nil {
		t.Fatalf("go list go-nvml: %v", err)
	}
	nvmlDir := filepath.Join(strings.TrimSpace(string(out)), "pkg", "nvml")
	cc, err := exec.Command("go", "env", "CC").Output()
	if err != nil {
		t.Fatal(err)
	}
	src := filepath.Join(t.TempDir(), "deprecated.c")
	call := `#include "nvml.h"
unsigned int appClock(nvmlDevice_t d) { unsigned int c = 0; nvmlDeviceGetApplicationsClock(d, NVML_CLOCK_GRAPHICS, &c); return c; }
`
	if err := os.WriteFile(src, []byte(call), 0o644); err != nil {
		t.Fatal(err)
	}
	compile := func(cflags []string) string {
		args := append(append([]string{}, cflags...), "-DNVML_NO_UNVERSIONED_FUNC_DEFS=1", "-I", nvmlDir, "-fsyntax-only", src)
		b, err := exec.Command(strings.TrimSpace(string(cc)), args...).CombinedOutput()
		if err != nil {
			t.Fatalf("%s %v: %v\n%s", cc, args, err, b)
		}
		return string(b)
	}
	if got := compile([]string{"-O2", "-g"}); !strings.Contains(got, "deprecated") {
		t.Fatalf("without -Wno-deprecated-declarations the call compiled silently (%q): the check proves nothing", got)
	}
	if got := compile(flags); got != "" {
		t.Errorf("with the Makefile's CGO_CFLAGS %q the compiler still prints:\n%s", flags, got)
	}
}
