package ortenv

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// FindLibrary reports the file the dynamic loader really opens: a system
// library by its path, a library reachable only through LD_LIBRARY_PATH
// (set before the process starts, as the bundle's launcher does) by that
// path, and a missing one with the loader's message naming it.
func TestFindLibrary(t *testing.T) {
	libc := FindLibrary("libc.so.6")
	if libc.Path == "" || !filepath.IsAbs(libc.Path) || libc.From != "system" || libc.Error != "" {
		t.Errorf("libc.so.6: %+v, want an absolute system path", libc)
	}
	if st, err := os.Stat(libc.Path); err != nil || st.IsDir() {
		t.Errorf("libc.so.6 at %q: %v", libc.Path, err)
	}
	missing := FindLibrary("libscorer-no-such-library.so.7")
	if missing.Path != "" || !strings.Contains(missing.Error, "libscorer-no-such-library.so.7") {
		t.Errorf("missing library: %+v, want the loader's error naming it", missing)
	}
	// On this CI host there is no CUDA: every CUDA library is reported
	// missing by name, none found by accident.
	for _, l := range FindCUDALibraries() {
		if l.Path == "" && !strings.Contains(l.Error, l.Name) {
			t.Errorf("%s: %+v, want the loader's error naming it", l.Name, l)
		}
	}
}
