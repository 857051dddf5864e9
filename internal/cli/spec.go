package cli

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"

	"github.com/scorer/scorer/internal/config"
)

// Spec describes a subcommand: its name, what it does, its own flags and
// the settings it reads. Its -h (Help), `scorer -h` (Usage) and README's
// usage section (Markdown) are all written from it, so none can list a flag
// the subcommand does not take or a setting it does not read.
type Spec struct {
	// Name is the subcommand as typed ("run", "gpu-proof bench").
	Name string
	// Synopsis follows the name on the usage line: "[flags]", "--in FILE".
	Synopsis string
	// Summary is one line for `scorer -h`; About, when set, a paragraph
	// for the subcommand's own help instead.
	Summary, About string
	// Settings is what the subcommand reads of the configuration.
	Settings config.Set
	// Flags registers the subcommand's own flags, the ones that are not
	// settings, with their defaults; nil for none. Command registers the
	// same flags through the same code.
	Flags func(fs *flag.FlagSet)
	// Sub are the subcommands under this one (gpu-proof's).
	Sub []Spec
}

// FlagSet is a new flag set for the subcommand, writing to e.Stderr, whose
// -h prints Help.
func (s Spec) FlagSet(e Env) *flag.FlagSet {
	fs := flag.NewFlagSet(s.Name, flag.ContinueOnError)
	fs.SetOutput(e.Stderr)
	fs.Usage = func() { s.Help(fs.Output()) }
	return fs
}

// Load reads the settings the subcommand reads (environment, then flags)
// over fs, which holds its own flags already, and parses args. Parse
// errors, -h included, come back as ErrUsage: the flag package printed
// them.
func (s Spec) Load(e Env, fs *flag.FlagSet, args []string) (config.Config, error) {
	cfg, err := config.Load(s.Settings, e.Getenv, fs, args)
	var fe config.FlagError
	if errors.Is(err, flag.ErrHelp) || errors.As(err, &fe) {
		return config.Config{}, ErrUsage
	}
	if err != nil {
		return config.Config{}, err
	}
	return cfg, nil
}

// Parse parses args for a subcommand that reads no settings.
func (s Spec) Parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return ErrUsage
	}
	return nil
}

// Help writes the subcommand's help: the usage line, what it does, its own
// flags and the settings it reads, group by group.
func (s Spec) Help(w io.Writer) {
	var b strings.Builder
	fmt.Fprintf(&b, "usage: scorer %s %s\n\n", s.Name, s.Synopsis)
	about := s.About
	if about == "" {
		about = s.Summary
	}
	fmt.Fprintf(&b, "%s\n", wrap(about, 78))
	if own := s.ownFlags(); own != "" {
		fmt.Fprintf(&b, "\nFlags:\n%s", own)
	}
	for _, sub := range s.Sub {
		fmt.Fprintf(&b, "\n  scorer %s %s\n    \t%s\n", sub.Name, sub.Synopsis, sub.Summary)
	}
	if len(s.Sub) > 0 {
		fmt.Fprintf(&b, "\nRun 'scorer %s <subcommand> -h' for its flags and settings.\n", s.Name)
	}
	if sts := s.Settings.Settings(); len(sts) > 0 {
		fmt.Fprintf(&b, "\nSettings: each from its environment variable, or from its flag, which wins\n(docs/configuration.md has their units, allowed values and defaults):\n")
		var g config.Group
		for _, st := range sts {
			if st.Group != g {
				g = st.Group
				fmt.Fprintf(&b, "%s\n", g.Title())
			}
			line := fmt.Sprintf("  -%s, %s", st.Flag, st.Env)
			if st.Values != "" {
				line += " [" + st.Values + "]"
			}
			if st.Default != "" {
				line += fmt.Sprintf(" (default %q)", st.Default)
			}
			fmt.Fprintf(&b, "%s\n    \t%s\n", line, st.Help)
		}
	}
	_, _ = io.WriteString(w, b.String())
}

// ownFlags is the subcommand's own flags as the flag package prints them.
func (s Spec) ownFlags() string {
	if s.Flags == nil {
		return ""
	}
	fs := flag.NewFlagSet(s.Name, flag.ContinueOnError)
	s.Flags(fs)
	var b strings.Builder
	fs.SetOutput(&b)
	fs.PrintDefaults()
	return b.String()
}

// Usage is `scorer -h`: every subcommand with its summary, then footer.
func Usage(specs []Spec, footer string) string {
	var b strings.Builder
	b.WriteString("usage: scorer <command> [flags]\n\ncommands:\n")
	for _, s := range specs {
		fmt.Fprintf(&b, "  %-9s %s\n", s.Name, s.Summary)
	}
	b.WriteString("\n" + footer)
	return b.String()
}

// Markdown is README's usage section: `scorer -h`, then each subcommand's
// usage line, summary, own flags and the settings groups it reads, linked
// to their place in docs/configuration.md.
func Markdown(specs []Spec, footer string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "```text\n$ scorer -h\n%s```\n", Usage(specs, footer))
	var section func(s Spec)
	section = func(s Spec) {
		about := s.About
		if about == "" {
			about = s.Summary
		}
		fmt.Fprintf(&b, "\n### `scorer %s`\n\n`scorer %s %s`\n\n%s\n", s.Name, s.Name, s.Synopsis, about)
		if own := s.ownFlags(); own != "" {
			fmt.Fprintf(&b, "\n```text\n%s```\n", own)
		}
		if len(s.Settings.Groups) > 0 {
			var links []string
			for _, g := range s.Settings.Groups {
				links = append(links, fmt.Sprintf("[%s](docs/configuration.md#%s)", g.Title(), config.Anchor(g)))
			}
			fmt.Fprintf(&b, "\nSettings read: %s.\n", strings.Join(links, ", "))
		}
		for _, sub := range s.Sub {
			section(sub)
		}
	}
	for _, s := range specs {
		section(s)
	}
	return b.String()
}

// wrap breaks text into lines of at most width runes at spaces.
func wrap(text string, width int) string {
	var lines []string
	line := ""
	for _, w := range strings.Fields(text) {
		if line != "" && len([]rune(line))+1+len([]rune(w)) > width {
			lines = append(lines, line)
			line = w
			continue
		}
		if line != "" {
			line += " "
		}
		line += w
	}
	if line != "" {
		lines = append(lines, line)
	}
	return strings.Join(lines, "\n")
}
