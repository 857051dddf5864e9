package testenv

import (
	"io"
	"os"
	"testing"
)

// FlipInPlace flips one bit of every byte in the second half of the file
// at path, writing through an open descriptor: the same inode and size, as
// `cp` over the file or a sync sidecar writing in place gives. The model
// package's and `scorer run`'s tests of model files changed under a
// running scorer use it.
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
}
