package testenv

import (
	"io"
	"os"
	"testing"
	"time"
)

// FlipInPlace flips one bit of every byte in the second half of the file
// at path, writing through an open descriptor, then sets its
// modification time back to what it was: the same inode,
// size and mtime, as `rsync --inplace -t`, `cp -p` from an artifact with
// normalised timestamps (Bazel, ko, nix) or `touch -r` give. Only the
// status-change time (ctime), which user space cannot set, tells the
// write. The model package's and `scorer run`'s tests of model files
// changed under a running scorer use it: a check that passes them also
// sees a plain write, which moves the mtime as well.
func FlipInPlace(t testing.TB, path string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		t.Fatal(err)
	}
	half := st.Size() / 2
	b := make([]byte, st.Size()-half)
	if _, err := f.ReadAt(b, half); err != nil && err != io.EOF {
		t.Fatal(err)
	}
	for i := range b {
		b[i] ^= 0x01
	}
	if _, err := f.WriteAt(b, half); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}
	// A zero access time leaves it as the write left it.
	if err := os.Chtimes(path, time.Time{}, st.ModTime()); err != nil {
		t.Fatal(err)
	}
	if now, err := os.Stat(path); err != nil {
		t.Fatal(err)
	} else if !now.ModTime().Equal(st.ModTime()) || now.Size() != st.Size() {
		t.Fatalf("FlipInPlace %s: modified %v, %d bytes; want %v and %d as before", path, now.ModTime(), now.Size(), st.ModTime(), st.Size())
	}
}
