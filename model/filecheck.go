package model

import (
	"errors"
	"fmt"
	"os"
	"slices"
	"time"
)

// ErrModelFileChanged is NewSession's error once a model file was written
// in place, replaced (another file renamed over it) or removed since Load
// read it, and its bytes are not the same: a session would run weights
// other than the model's version. The bytes that were loaded cannot be
// read again; restarting the process loads the files as they are. gpupool
// reports it as an engine that cannot be opened.
var ErrModelFileChanged = errors.New("model: a model file changed on disk")

// fileState is a held file as it is now: the stamp of what its
// descriptor reads, and whether the path ORT opens (heldFile.real) still
// names it, names another file (moved: named is that file's stamp) or
// was removed.
type fileState struct {
	stamp, named   fileStamp
	moved, removed bool
}

// fileStates are the held files' states now, in m.held's order. filesMu
// is held.
func (m *Model) fileStates() ([]fileState, error) {
	out := make([]fileState, len(m.held))
	for i, h := range m.held {
		st, err := h.f.Stat()
		if err != nil {
			return nil, fmt.Errorf("model: checking %s: %w", h.path, err)
		}
		fs := fileState{stamp: stampOf(st)}
		if named, err := os.Stat(h.real); errors.Is(err, os.ErrNotExist) {
			fs.removed = true
		} else if err != nil {
			return nil, fmt.Errorf("model: checking %s: %w", h.real, err)
		} else if !os.SameFile(named, st) {
			fs.moved, fs.named = true, stampOf(named)
		}
		out[i] = fs
	}
	return out, nil
}

// firstChanged is the index of the first of states (fileStates) whose
// file changed since it was read, -1 when none did. filesMu is held.
func (m *Model) firstChanged(states []fileState) int {
	for i, fs := range states {
		if fs != (fileState{stamp: m.held[i].stamp}) {
			return i
		}
	}
	return -1
}

// changedFile is the first held file that changed since it was read, and
// its state; -1 when none did. filesMu is held.
func (m *Model) changedFile() (int, fileState, error) {
	states, err := m.fileStates()
	if err != nil {
		return 0, fileState{}, err
	}
	if i := m.firstChanged(states); i >= 0 {
		return i, states[i], nil
	}
	return -1, fileState{}, nil
}

// changed is the ErrModelFileChanged of held file i, now in state is;
// when says since when. filesMu is held.
func (m *Model) changed(i int, is fileState, when string) error {
	was := m.held[i].stamp
	what := fmt.Sprintf("written in place %s (modified at %s)", when, time.Unix(0, is.stamp.mtime).UTC().Format(time.RFC3339Nano))
	switch {
	case is.removed:
		what = "removed " + when
	case is.moved:
		what = "replaced by another file " + when
	case was.size != is.stamp.size:
		what = fmt.Sprintf("written in place %s (%d bytes, was %d)", when, is.stamp.size, was.size)
	case was.mtime == is.stamp.mtime:
		// Only the ctime moved (fileStamp): new bytes under the old size
		// and mtime, as rsync --inplace -t or cp -p leave them.
		what = fmt.Sprintf("written in place %s with its size and modification time kept (status changed at %s)", when,
			time.Unix(0, is.stamp.ctime).UTC().Format(time.RFC3339Nano))
	}
	version := "the version being loaded"
	if m.hashed != "" {
		version = "version " + m.hashed[:12]
	}
	name := m.held[i].path
	if r := m.held[i].real; r != name {
		name += " (" + r + ")"
	}
	return fmt.Errorf("%w: %s was %s: a session would not run %s; restart the process to load the model as it is now",
		ErrModelFileChanged, name, what, version)
}

// hashedAs records the version Load's hash gave, unless a file changed
// while it was hashed (the version may then be of neither content).
func (m *Model) hashedAs(sha string) error {
	m.filesMu.Lock()
	defer m.filesMu.Unlock()
	i, is, err := m.changedFile()
	if err != nil {
		return err
	}
	if i >= 0 {
		return m.changed(i, is, "while the model was loaded")
	}
	m.hashed = sha
	return nil
}

// CheckFiles is checkFiles for liveness: a session already open keeps
// reading its weights from these files (ORT maps them on the CPU), so a
// change is not only a reason to refuse the next session but a reason to
// restart the process (internal/service fails /healthz on it). Cheap while
// nothing changed: a stat of each file.
func (m *Model) CheckFiles() error { return m.checkFiles() }

// checkFiles is nil when the model's files are those Load read, else
// ErrModelFileChanged when their bytes are no longer the version's. A
// file changed with the same bytes (touched, or the same content copied
// over it again) costs one hash of the files, which are then held as
// they are now.
//
// Why stamps, and a hash only when one moved: an in-place write changes
// what even the held descriptor reads (the same inode) and always sets
// the status-change time, whatever it does with the modification time
// (fileStamp); a file renamed over the path is another inode; a hash on
// every NewSession would cost seconds on a 1.7 GB model. A stamp that
// moves with the bytes unchanged (touch, chmod, chown, a hard link added:
// each sets the ctime) is resolved by that hash, never refused.
func (m *Model) checkFiles() error {
	m.filesMu.Lock()
	defer m.filesMu.Unlock()
	states, err := m.fileStates()
	if err != nil {
		return err
	}
	i := m.firstChanged(states)
	if i < 0 {
		return nil
	}
	is := states[i]
	if m.hashed == "" {
		return m.changed(i, is, "while the model was loaded")
	}
	// gpupool asks again for each batch no device can run: the files as
	// they were refused are refused again without a hash.
	if m.refused != nil && slices.Equal(states, m.refusedStates) {
		return m.refused
	}
	refused := m.changed(i, is, "since Load read it")
	refuse := func() error {
		m.refusedStates, m.refused = states, refused
		return refused
	}
	if is.removed {
		return refuse()
	}
	// The files as ORT would open them now.
	fresh := make([]heldFile, len(m.held))
	for j, h := range m.held {
		f, err := os.Open(h.real)
		var st os.FileInfo
		if err == nil {
			st, err = f.Stat()
		}
		if err != nil {
			if f != nil {
				f.Close()
			}
			closeHeld(fresh)
			return refuse()
		}
		fresh[j] = heldFile{path: h.path, real: h.real, f: f, stamp: stampOf(st)}
	}
	sha, err := hashModel(m.versionState, m.ONNXPath, m.dataFiles, fresh)
	if err != nil || sha != m.hashed {
		closeHeld(fresh)
		return refuse()
	}
	closeHeld(m.held)
	m.held = fresh
	// Written during the hash?
	if i, is, err := m.changedFile(); err != nil {
		return err
	} else if i >= 0 {
		return m.changed(i, is, "while it was hashed again")
	}
	return nil
}

// closeHeld closes the files of held that are open.
func closeHeld(held []heldFile) {
	for _, h := range held {
		if h.f != nil {
			h.f.Close()
		}
	}
}
