package main

import (
	"bufio"
	"flag"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/testenv"
)

// update rewrites the generated docs instead of comparing them: `make docs`.
var update = flag.Bool("update", false, "rewrite docs/configuration.md and README.md's usage section from the code")

// Markers of README.md's generated usage section.
const (
	usageBegin = "<!-- usage:begin: written by `make docs` from the subcommands' flags and settings; do not edit by hand -->\n"
	usageEnd   = "<!-- usage:end -->\n"
)

// TestDocsConfigurationReference: docs/configuration.md is the reference
// internal/config writes from Config itself, letter for letter.
func TestDocsConfigurationReference(t *testing.T) {
	path := filepath.Join(testenv.RepoRoot(), "docs", "configuration.md")
	want := config.Reference()
	if *update {
		if err := os.WriteFile(path, []byte(want), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != want {
		t.Errorf("docs/configuration.md is stale: run `make docs` (first difference at line %d)", firstDiff(string(got), want))
	}
}

// TestDocsReadmeUsage: README.md's usage section is what the subcommands'
// specs write (`scorer -h`, each one's flags and the settings it reads).
func TestDocsReadmeUsage(t *testing.T) {
	path := filepath.Join(testenv.RepoRoot(), "README.md")
	readme, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	before, rest, ok1 := strings.Cut(string(readme), usageBegin)
	_, after, ok2 := strings.Cut(rest, usageEnd)
	if !ok1 || !ok2 {
		t.Fatalf("README.md lacks the generated usage section's markers:\n%s%s", usageBegin, usageEnd)
	}
	want := cli.Markdown(specs(), usageFooter)
	if *update {
		if err := os.WriteFile(path, []byte(before+usageBegin+want+usageEnd+after), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	if got, _, _ := strings.Cut(rest, usageEnd); got != want {
		t.Errorf("README.md's usage section is stale: run `make docs` (first difference at line %d of the section)", firstDiff(got, want))
	}
}

// TestDocsNoOtherVariableTable: the reference is the one table of
// variables; README, docs/*.md and the Helm values link to it.
func TestDocsNoOtherVariableTable(t *testing.T) {
	root := testenv.RepoRoot()
	files, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	files = append(files, filepath.Join(root, "README.md"))
	row := regexp.MustCompile("^\\| `[A-Z][A-Z0-9_]+` \\|")
	for _, f := range files {
		if filepath.Base(f) == "configuration.md" {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		sc := bufio.NewScanner(strings.NewReader(string(data)))
		for sc.Scan() {
			if row.MatchString(sc.Text()) {
				n++
			}
		}
		if n > 3 {
			t.Errorf("%s has a table of %d variables; link to docs/configuration.md instead", f, n)
		}
	}
	for _, f := range []string{"README.md", "docs/design.md", "docs/operating.md", "deploy/helm/scorer/values.yaml"} {
		data, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(data), "configuration.md") {
			t.Errorf("%s does not link to docs/configuration.md", f)
		}
	}
}

// TestHelpListsWhatACommandReads: each subcommand's -h lists its own
// flags and exactly the settings of its set, with a line of help each;
// the subcommands that score take no Kafka or HTTP setting, as flag or
// from the environment.
func TestHelpListsWhatACommandReads(t *testing.T) {
	for _, c := range commands {
		for _, s := range append([]cli.Spec{c.spec}, c.spec.Sub...) {
			t.Run(s.Name, func(t *testing.T) {
				_, stderr, err := runCLI(t, nil, "", append(strings.Fields(s.Name), "-h")...)
				if cli.ExitCode(err) != 2 {
					t.Fatalf("-h: %v (exit %d), want the help and exit 2", err, cli.ExitCode(err))
				}
				var want []string
				for _, st := range s.Settings.Settings() {
					want = append(want, st.Env)
				}
				var got []string
				for _, m := range regexp.MustCompile(`(?m)^  -[a-z0-9-]+, ([A-Z0-9_]+)`).FindAllStringSubmatch(stderr, -1) {
					got = append(got, m[1])
				}
				if !slices.Equal(got, want) {
					t.Errorf("-h lists settings %v, want %v", got, want)
				}
				var empty []string
				own := flag.NewFlagSet("", flag.ContinueOnError)
				if s.Flags != nil {
					s.Flags(own)
				}
				own.VisitAll(func(f *flag.Flag) {
					if strings.TrimSpace(f.Usage) == "" {
						empty = append(empty, f.Name)
					}
					if !strings.Contains(stderr, "  -"+f.Name) {
						t.Errorf("-h does not show its flag -%s", f.Name)
					}
				})
				if len(empty) > 0 {
					t.Errorf("undocumented flags: %v", empty)
				}
			})
		}
	}
	for _, name := range []string{"score", "doctor", "compare", "bench"} {
		for _, fl := range []string{"--kafka-brokers", "--metrics-addr", "--kafka-input-topic"} {
			_, _, err := runCLI(t, nil, "", name, fl, "x")
			if cli.ExitCode(err) != 2 {
				t.Errorf("%s %s x: %v (exit %d), want the flag refused (exit 2)", name, fl, err, cli.ExitCode(err))
			}
		}
	}
}

// firstDiff is the first line (1-based) where a and b differ.
func firstDiff(a, b string) int {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1
		}
	}
	return min(len(al), len(bl)) + 1
}

// TestPackageDocListsEveryCommand: the package comment (go doc's first
// screen) names every subcommand `scorer -h` lists.
func TestPackageDocListsEveryCommand(t *testing.T) {
	f, err := parser.ParseFile(token.NewFileSet(), "main.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		t.Fatal(err)
	}
	doc := f.Doc.Text()
	for _, c := range commands {
		if !regexp.MustCompile(`(?m)^\s*scorer ` + regexp.QuoteMeta(c.spec.Name) + `\s`).MatchString(doc) {
			t.Errorf("main.go's package comment does not list `scorer %s`:\n%s", c.spec.Name, doc)
		}
	}
}
