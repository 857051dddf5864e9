package bench

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/testenv"
)

// TestSectionTableInDesign: docs/design.md shows the section table the code
// runs by, between its bench-sections markers; a section added to the table
// is added there too.
func TestSectionTableInDesign(t *testing.T) {
	path := filepath.Join(testenv.RepoRoot(), "docs", "design.md")
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- bench-sections:begin -->\n", "<!-- bench-sections:end -->"
	doc := string(b)
	i, j := strings.Index(doc, begin), strings.Index(doc, end)
	if i < 0 || j < i {
		t.Fatalf("%s has no %q … %q lines", path, strings.TrimSpace(begin), end)
	}
	if got, want := doc[i+len(begin):j], sectionsMarkdown(); got != want {
		t.Errorf("%s's section table is not the code's; want:\n%s", path, want)
	}
}

// TestSectionNames: every section has a name, what it measures, how it
// runs, its rows and a test for its data, and no name is used twice.
func TestSectionNames(t *testing.T) {
	seen := map[string]bool{}
	for _, s := range sections {
		if s.name == "" || s.measures == "" || s.runs == "" || s.rows == "" || s.has == nil || seen[s.name] {
			t.Errorf("section %+v: want every field, and a name of its own", s)
		}
		seen[s.name] = true
		if sectionNamed(s.name) == nil {
			t.Errorf("sectionNamed(%q) = nil", s.name)
		}
	}
}

// TestSkipSet: --skip takes the table's names and refuses others.
func TestSkipSet(t *testing.T) {
	got, err := skipSet("large, production")
	if err != nil || !got["large"] || !got["production"] || len(got) != 2 {
		t.Errorf(`skipSet("large, production") = %v, %v`, got, err)
	}
	var ue cli.UsageError
	if _, err := skipSet("pipeline,prodution"); !errors.As(err, &ue) || !strings.Contains(err.Error(), "prodution") {
		t.Errorf("skipSet with a typo: %v, want a usage error naming it", err)
	}
}

// TestSectionScopesInTableOrder: the driver runs the eachModel sections,
// then the eachPerf ones, then the once ones, each group in table order,
// so the table lists them in that order to keep "the order they run"
// true; every row has a run function.
func TestSectionScopesInTableOrder(t *testing.T) {
	for i, s := range sections {
		if s.run == nil {
			t.Errorf("%s: no run function", s.name)
		}
		if i > 0 && s.scope < sections[i-1].scope {
			t.Errorf("%s (scope %d) after %s (scope %d)", s.name, s.scope, sections[i-1].name, sections[i-1].scope)
		}
	}
}
