// Package dist builds the portable GPU bundle, for hosts that cannot run
// the CUDA image (Databricks, Slurm, bare metal):
// scorer-<version>-linux-amd64-cuda.tar.zst holding the scorer binary, the
// pinned ONNX Runtime core with its CUDA provider libraries (`make
// cuda-ort`'s folder, one release), the launcher that finds CUDA 13 and
// cuDNN 9 on the host or in a Python environment's NVIDIA wheels, a README
// and SHA256SUMS. `make dist` runs it through tools/dist; deploy's bundle
// test builds one, unpacks it and runs its doctor.
package dist

import (
	"archive/tar"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/klauspost/compress/zstd"
)

// Options says what goes into the bundle.
type Options struct {
	// Version names the bundle (scorer-<Version>-linux-amd64-cuda).
	Version string
	// Binary is the scorer executable (libexec/scorer in the bundle).
	Binary string
	// ORTDir is `make cuda-ort`'s folder: libonnxruntime.so.1 and the
	// provider libraries, all of one release (lib/onnxruntime/).
	ORTDir string
	// Launcher and README are deploy/dist/scorer and deploy/dist/README.md
	// (bin/scorer and README.md).
	Launcher, README string
	// OutDir receives the .tar.zst and its .sha256.
	OutDir string
	// Level is the zstd level (default zstd.SpeedBetterCompression).
	Level zstd.EncoderLevel
}

// Name is the bundle's folder and file stem.
func Name(version string) string { return "scorer-" + version + "-linux-amd64-cuda" }

// entry is one file of the bundle: its path inside, its source and mode.
type entry struct {
	path, src string
	mode      int64
}

// Build writes OutDir/<Name>.tar.zst and <Name>.tar.zst.sha256 and returns
// the archive's path. Every entry has a fixed owner and time, so the same
// inputs give the same bytes.
func Build(o Options) (string, error) {
	if o.Version == "" || strings.ContainsAny(o.Version, "/ ") {
		return "", fmt.Errorf("dist: version %q: want a non-empty name without / or spaces", o.Version)
	}
	if o.Level == 0 {
		o.Level = zstd.SpeedBetterCompression
	}
	libs, err := ortFiles(o.ORTDir)
	if err != nil {
		return "", err
	}
	entries := []entry{{"bin/scorer", o.Launcher, 0o755}, {"libexec/scorer", o.Binary, 0o755}, {"README.md", o.README, 0o644}}
	for _, l := range libs {
		entries = append(entries, entry{"lib/onnxruntime/" + filepath.Base(l), l, 0o644})
	}
	var sums strings.Builder
	for _, e := range entries {
		sum, err := fileSHA256(e.src)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&sums, "%s  %s\n", sum, e.path)
	}
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return "", fmt.Errorf("dist: %w", err)
	}
	name := Name(o.Version)
	out := filepath.Join(o.OutDir, name+".tar.zst")
	tmp := out + ".tmp"
	if err := writeArchive(tmp, name, entries, o.Version, sums.String(), o.Level); err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, out); err != nil {
		return "", fmt.Errorf("dist: %w", err)
	}
	sum, err := fileSHA256(out)
	if err != nil {
		return "", err
	}
	if err := os.WriteFile(out+".sha256", []byte(sum+"  "+filepath.Base(out)+"\n"), 0o644); err != nil {
		return "", fmt.Errorf("dist: %w", err)
	}
	return out, nil
}

// ortFiles lists the ONNX Runtime folder's libraries and insists on the
// CUDA set: ORT loads the providers from the core's own folder.
func ortFiles(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.so*"))
	if err != nil {
		return nil, fmt.Errorf("dist: %w", err)
	}
	for _, want := range []string{"libonnxruntime.so.1", "libonnxruntime_providers_shared.so", "libonnxruntime_providers_cuda.so"} {
		if !slices.Contains(files, filepath.Join(dir, want)) {
			return nil, fmt.Errorf("dist: %s has no %s: build the CUDA set with `make cuda-ort`", dir, want)
		}
	}
	return files, nil
}

func writeArchive(path, root string, entries []entry, version, sums string, level zstd.EncoderLevel) (err error) {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("dist: %w", err)
	}
	defer func() { err = errors.Join(err, f.Close()) }()
	zw, err := zstd.NewWriter(f, zstd.WithEncoderLevel(level))
	if err != nil {
		return fmt.Errorf("dist: %w", err)
	}
	tw := tar.NewWriter(zw)
	mtime := time.Unix(0, 0)
	hdr := func(name string, mode, size int64, typ byte) *tar.Header {
		return &tar.Header{Name: root + "/" + name, Mode: mode, Size: size, Typeflag: typ, ModTime: mtime, Uname: "root", Gname: "root", Format: tar.FormatPAX}
	}
	dirs := map[string]bool{}
	addDirs := func(p string) error {
		var chain []string
		for d := filepath.Dir(p); d != "."; d = filepath.Dir(d) {
			chain = append([]string{d}, chain...)
		}
		for _, d := range append([]string{""}, chain...) {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			h := hdr(d+"/", 0o755, 0, tar.TypeDir)
			if d == "" {
				h.Name = root + "/"
			}
			if err := tw.WriteHeader(h); err != nil {
				return err
			}
		}
		return nil
	}
	add := func(name string, mode int64, r io.Reader, size int64) error {
		if err := addDirs(name); err != nil {
			return fmt.Errorf("dist: %w", err)
		}
		if err := tw.WriteHeader(hdr(name, mode, size, tar.TypeReg)); err != nil {
			return fmt.Errorf("dist: %s: %w", name, err)
		}
		if _, err := io.Copy(tw, r); err != nil {
			return fmt.Errorf("dist: %s: %w", name, err)
		}
		return nil
	}
	for _, e := range entries {
		src, err := os.Open(e.src)
		if err != nil {
			return fmt.Errorf("dist: %w", err)
		}
		st, err := src.Stat()
		if err == nil {
			err = add(e.path, e.mode, src, st.Size())
		}
		src.Close()
		if err != nil {
			return err
		}
	}
	for _, extra := range []struct{ name, body string }{{"VERSION", version + "\n"}, {"SHA256SUMS", sums}} {
		if err := add(extra.name, 0o644, strings.NewReader(extra.body), int64(len(extra.body))); err != nil {
			return err
		}
	}
	if err := tw.Close(); err != nil {
		return fmt.Errorf("dist: %w", err)
	}
	if err := zw.Close(); err != nil {
		return fmt.Errorf("dist: %w", err)
	}
	return nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", fmt.Errorf("dist: %w", err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("dist: %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// Extract unpacks a bundle under dir, as `tar --zstd -xf` would, and
// returns the bundle's root folder. It refuses entries that would land
// outside dir.
func Extract(archive, dir string) (string, error) {
	f, err := os.Open(archive)
	if err != nil {
		return "", fmt.Errorf("dist: %w", err)
	}
	defer f.Close()
	zr, err := zstd.NewReader(f)
	if err != nil {
		return "", fmt.Errorf("dist: %w", err)
	}
	defer zr.Close()
	tr := tar.NewReader(zr)
	root := ""
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return "", fmt.Errorf("dist: %s: %w", archive, err)
		}
		p := filepath.Join(dir, h.Name)
		if !strings.HasPrefix(p, filepath.Clean(dir)+string(os.PathSeparator)) {
			return "", fmt.Errorf("dist: %s: entry %q leaves the folder", archive, h.Name)
		}
		if root == "" {
			root = filepath.Join(dir, strings.SplitN(h.Name, "/", 2)[0])
		}
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(p, 0o755); err != nil {
				return "", fmt.Errorf("dist: %w", err)
			}
		case tar.TypeReg:
			out, err := os.OpenFile(p, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, os.FileMode(h.Mode)&0o777)
			if err != nil {
				return "", fmt.Errorf("dist: %w", err)
			}
			_, err = io.Copy(out, tr)
			if err = errors.Join(err, out.Close()); err != nil {
				return "", fmt.Errorf("dist: %s: %w", h.Name, err)
			}
		default:
			return "", fmt.Errorf("dist: %s: entry %q of type %c not expected", archive, h.Name, h.Typeflag)
		}
	}
	return root, nil
}
