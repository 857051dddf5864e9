package offline

import (
	"errors"
	"fmt"
	"io/fs"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strconv"
	"syscall"
)

// outputFile is --out written all or nothing: a temporary file in the same
// folder, renamed over --out by commit; abort (deferred) removes it, so a
// failed or interrupted run leaves an existing --out as it was. A --out that
// is not a regular file (/dev/null, a FIFO) is written in place.
//
// A new --out gets 0666 less the process's umask, as a file any other tool
// creates; a replaced one keeps its mode. commit fsyncs the file before the
// rename and the folder after it, so a completed run survives a power loss.
type outputFile struct {
	f      *os.File
	target string // "" when writing in place
	done   bool
	keep   bool // --resume's partial file: abort keeps it
	// syncDir makes a rename in dir durable; fsyncDir but in tests.
	syncDir func(dir string) error
}

func createOutput(path string) (*outputFile, error) {
	target := path
	var keepMode *fs.FileMode
	if st, err := os.Stat(path); err == nil {
		if !st.Mode().IsRegular() {
			f, err := os.OpenFile(path, os.O_WRONLY|os.O_TRUNC, 0)
			if err != nil {
				return nil, err
			}
			return &outputFile{f: f, syncDir: fsyncDir}, nil
		}
		mode := st.Mode().Perm()
		keepMode = &mode
		// Replace the file a symlink points to, not the symlink.
		if t, err := filepath.EvalSymlinks(path); err == nil {
			target = t
		}
	}
	f, err := createTemp(filepath.Dir(target), "."+filepath.Base(target)+".tmp-")
	if err != nil {
		return nil, err
	}
	if keepMode != nil {
		if err := f.Chmod(*keepMode); err != nil {
			f.Close()
			os.Remove(f.Name())
			return nil, err
		}
	}
	return &outputFile{f: f, target: target, syncDir: fsyncDir}, nil
}

// createTemp creates a new file dir/prefix<random>. Unlike os.CreateTemp
// (always 0600) it asks for 0666 and lets the kernel apply the umask.
func createTemp(dir, prefix string) (*os.File, error) {
	for range 100 {
		name := filepath.Join(dir, prefix+strconv.FormatUint(rand.Uint64(), 36))
		f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o666)
		if errors.Is(err, fs.ErrExist) {
			continue
		}
		return f, err
	}
	return nil, fmt.Errorf("creating a temporary file in %s: too many name collisions", dir)
}

// commit makes the output visible under --out, durably.
func (o *outputFile) commit() error {
	o.done = true
	if o.target == "" {
		return o.f.Close()
	}
	err := o.f.Sync()
	if cerr := o.f.Close(); err == nil {
		err = cerr // a failed close can lose buffered output on some filesystems
	}
	if err == nil {
		err = os.Rename(o.f.Name(), o.target)
	}
	if err != nil {
		if !o.keep {
			os.Remove(o.f.Name())
		}
		return err
	}
	if err := o.syncDir(filepath.Dir(o.target)); err != nil {
		return fmt.Errorf("%s is complete, but its folder could not be synced, so a power loss may still lose the rename: %w", o.target, err)
	}
	return nil
}

// abort drops the output unless commit ran.
func (o *outputFile) abort() {
	if o.done {
		return
	}
	o.done = true
	o.f.Close()
	if o.target != "" && !o.keep {
		os.Remove(o.f.Name())
	}
}

// fsyncDir makes the entries of dir (a rename, a new file) durable. A
// filesystem that cannot sync a folder (EINVAL, ENOTSUP) has nothing more
// to offer, so that is no error.
func fsyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	if cerr := d.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, syscall.EINVAL) || errors.Is(err, syscall.ENOTSUP) {
		return nil
	}
	return err
}

// sameFile reports whether --in and --out name one file: the same cleaned
// absolute path, or (both existing) the same file through links.
func sameFile(a, b string) bool {
	pa, errA := filepath.Abs(a)
	pb, errB := filepath.Abs(b)
	if errA == nil && errB == nil && pa == pb {
		return true
	}
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && sa.Mode().IsRegular() && os.SameFile(sa, sb)
}
