package cli

import (
	"errors"
	"io"
	"runtime/debug"
)

// ErrUsage marks errors already reported as usage text: the binary's main
// prints nothing more and exits 2.
var ErrUsage = errors.New("usage")

// ErrInterrupted is a command stopped by SIGINT/SIGTERM before it finished;
// main exits 130 on it.
var ErrInterrupted = errors.New("interrupted")

// UsageError is a wrong use of flags found after parsing: main prints it
// and exits 2.
type UsageError struct{ Msg string }

func (e UsageError) Error() string { return e.Msg }

// Env bundles what a subcommand may touch of the process, so tests can run
// subcommands in-process and every subcommand package takes the same thing.
type Env struct {
	Getenv func(string) string
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// ExitCode is the process exit status for a subcommand's error: 2 for a
// wrong use (ErrUsage, UsageError), 130 for ErrInterrupted, else 1. It lives
// here, beside the errors it reads, so main and every subcommand's tests
// agree on it.
func ExitCode(err error) int {
	var ue UsageError
	switch {
	case errors.Is(err, ErrUsage), errors.As(err, &ue):
		return 2
	case errors.Is(err, ErrInterrupted):
		return 130
	}
	return 1
}

// version is stamped by image and bundle builds (-ldflags "-X
// github.com/scorer/scorer/internal/cli.version=..."): they build from a
// copy without .git, where the build information holds no revision and the
// module version reads "(devel)".
var version string

// Version is the version stamped at build time, else the VCS revision (12
// hex digits) or module version the binary was built from; "unknown"
// without build information.
func Version() string {
	if version != "" {
		return version
	}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return "unknown"
	}
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" && len(s.Value) >= 12 {
			return s.Value[:12]
		}
	}
	return bi.Main.Version
}
