package cli

import (
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"
	"golang.org/x/term"
)

// NewLogger builds the process's one logger: JSON for machines, console
// text when stderr is a terminal (LOG_FORMAT=auto) or when asked.
func NewLogger(w io.Writer, level, format string) (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Nop(), fmt.Errorf("config: LOG_LEVEL %q: want debug, info, warn or error", level)
	}
	switch format {
	case "json":
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	case "auto", "":
		if f, ok := w.(*os.File); ok && term.IsTerminal(int(f.Fd())) {
			w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
		}
	default:
		return zerolog.Nop(), fmt.Errorf("config: LOG_FORMAT %q: want json, console or auto", format)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}

// ReportLogger is NewLogger for a command whose output is a report on
// stdout (bench, doctor): its components' info lines would bury the report,
// so it logs warnings only unless LOG_LEVEL or --log-level (on fs, already
// parsed) asks for a level, which then applies as given in level.
func ReportLogger(e Env, fs *flag.FlagSet, w io.Writer, level, format string) (zerolog.Logger, error) {
	asked := e.Getenv("LOG_LEVEL") != ""
	fs.Visit(func(f *flag.Flag) { asked = asked || f.Name == "log-level" })
	if !asked {
		level = "warn"
	}
	return NewLogger(w, level, format)
}
