package gpupool

import (
	"os"
	"path/filepath"
	"syscall"
	"testing"
)

// TestProcMappedUnread reads this process's own mappings: a data file
// mapped and unread counts whole, and what is read of it leaves the count;
// the executable's and the libraries' pages never count.
func TestProcMappedUnread(t *testing.T) {
	const size = 8 << 20
	path := filepath.Join(t.TempDir(), "weights.data")
	if err := os.WriteFile(path, make([]byte, size), 0o600); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var m procSelf
	before, err := m.mappedUnread()
	if err != nil {
		t.Fatal(err)
	}
	// The test binary and the C libraries are mapped, most pages unread.
	if before > 1<<20 {
		t.Errorf("%d bytes before mapping any data file, want under 1 MiB: code is not weights", before)
	}
	b, err := syscall.Mmap(int(f.Fd()), 0, size, syscall.PROT_READ, syscall.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(b)
	mapped, err := m.mappedUnread()
	if err != nil {
		t.Fatal(err)
	}
	// Other goroutines' files may come and go; 1 MiB of slack.
	if d := int64(mapped) - int64(before); d < size-1<<20 || d > size+1<<20 {
		t.Errorf("mapping an unread %d-byte file added %d bytes, want about %d", size, d, size)
	}
	var sum byte
	for i := 0; i < size/2; i += os.Getpagesize() {
		sum |= b[i]
	}
	if sum != 0 {
		t.Fatal("the file reads back other than written")
	}
	read, err := m.mappedUnread()
	if err != nil {
		t.Fatal(err)
	}
	// Readahead may bring in more than was read, never less.
	if d := int64(mapped) - int64(read); d < size/2-1<<20 {
		t.Errorf("reading half the mapping took %d bytes off the count, want at least %d", d, size/2)
	}
}
