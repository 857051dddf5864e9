package config

import (
	"os"
	"path/filepath"
	"strings"
)

// SplitList splits a list setting or flag: see cleanList.
func SplitList(s, sep string) []string {
	if sep == "" {
		sep = ","
	}
	return cleanList(strings.Split(s, sep))
}

// cleanList trims every element and drops empty ones, so that
// "a, b,,c " is [a b c] whether it came from a flag or the environment.
func cleanList(l []string) []string {
	var out []string
	for _, p := range l {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// ResolvePath finds a relative path from the working directory or, failing
// that, from the repository the binary was built in (bin/..), so that
// `bin/scorer` works from anywhere after `make`. ORT_LIB's default is
// absolute already (DefaultORTLib): a library is never picked up
// from the working directory unless ORT_LIB names it.
func ResolvePath(p string) (string, error) {
	if filepath.IsAbs(p) {
		if _, err := os.Stat(p); err != nil {
			return "", err
		}
		return p, nil
	}
	candidates := []string{p}
	if exe, err := os.Executable(); err == nil {
		candidates = append(candidates, filepath.Join(filepath.Dir(exe), "..", p))
	}
	for _, c := range candidates {
		if _, err := os.Stat(c); err == nil {
			return filepath.Abs(c)
		}
	}
	_, err := os.Stat(p)
	return "", err
}
