package deploy

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// metricDocRe finds a metric and its label names as the docs write them: `scorer_x{a,b}`, where a label
// may carry its values (`kind=result|row`).
var metricDocRe = regexp.MustCompile(`\b(scorer_[a-z0-9_]+)(?:\{([^}]*)\})?`)

// TestMetricsDocumented: docs/operating.md's Metrics table lists every metric the code registers, with
// exactly its labels, and nothing else; docs/design.md's list names the same metrics with the same
// labels; and the values of the labels an operator filters on are all documented: every dead-letter
// reason on scorer_dlq_total's row, every output kind on scorer_messages_out_total's.
func TestMetricsDocumented(t *testing.T) {
	code := registeredMetrics(t)
	if len(code) < 30 {
		t.Fatalf("found %d metric registrations in the code; the parse looks wrong", len(code))
	}
	rows := operatingMetricRows(t)
	documented := map[string][]string{}
	for name, row := range rows {
		documented[name] = row.labels
	}
	compareMetrics(t, "docs/operating.md's Metrics table", documented, code)
	compareMetrics(t, "docs/design.md's metrics list", designMetrics(t), code)

	for _, c := range []struct {
		metric string
		values []string
	}{
		{"scorer_dlq_total", dlqReasons(t)},
		{"scorer_messages_out_total", constStrings(t, "../producer/producer.go", "kind")},
	} {
		if len(c.values) < 3 {
			t.Fatalf("%s: label values parsed from the code: %v", c.metric, c.values)
		}
		for _, v := range c.values {
			if !strings.Contains(rows[c.metric].text, "`"+v+"`") {
				t.Errorf("docs/operating.md's row of %s does not name the value `%s`", c.metric, v)
			}
		}
	}
}

func compareMetrics(t *testing.T, where string, doc, code map[string][]string) {
	t.Helper()
	for name, labels := range code {
		got, ok := doc[name]
		switch {
		case !ok:
			t.Errorf("%s lacks %s{%s}, which the code registers", where, name, strings.Join(labels, ","))
		case !slices.Equal(got, labels):
			t.Errorf("%s gives %s the labels {%s}; the code registers {%s}", where, name, strings.Join(got, ","), strings.Join(labels, ","))
		}
	}
	for name := range doc {
		if _, ok := code[name]; !ok {
			t.Errorf("%s lists %s, which the code does not register", where, name)
		}
	}
}

// registeredMetrics finds every prometheus.New…(Opts{Name: "scorer_…"}, []string{labels…}) in the
// non-test Go code and returns each name's sorted label names.
func registeredMetrics(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir("..", func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() && (e.Name() == ".deps" || e.Name() == ".git" || e.Name() == "node_modules" || e.Name() == "testdata") {
			return filepath.SkipDir
		}
		if e.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if pkg, _ := sel.X.(*ast.Ident); pkg == nil || pkg.Name != "prometheus" || !strings.HasPrefix(sel.Sel.Name, "New") {
				return true
			}
			opts, ok := call.Args[0].(*ast.CompositeLit)
			if !ok {
				return true
			}
			name := ""
			for _, el := range opts.Elts {
				if kv, ok := el.(*ast.KeyValueExpr); ok {
					if key, _ := kv.Key.(*ast.Ident); key != nil && key.Name == "Name" {
						name = stringLit(kv.Value)
					}
				}
			}
			if !strings.HasPrefix(name, "scorer_") {
				return true
			}
			labels := []string{}
			if strings.HasSuffix(sel.Sel.Name, "Vec") && len(call.Args) > 1 {
				list, ok := call.Args[1].(*ast.CompositeLit)
				if !ok {
					t.Errorf("%s: %s's labels are not a literal list", fset.Position(call.Pos()), name)
					return true
				}
				for _, el := range list.Elts {
					labels = append(labels, stringLit(el))
				}
			}
			slices.Sort(labels)
			out[name] = labels
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func stringLit(e ast.Expr) string {
	if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
		s, err := strconv.Unquote(lit.Value)
		if err == nil {
			return s
		}
	}
	return ""
}

type metricRow struct {
	labels []string
	text   string
}

// operatingMetricRows parses the table under docs/operating.md's "## Metrics": each metric named in a
// row's first cell, its labels, and the row's text.
func operatingMetricRows(t *testing.T) map[string]metricRow {
	t.Helper()
	data, err := os.ReadFile(operatingDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Metrics\n")
	if !ok {
		t.Fatalf("%s has no ## Metrics section", operatingDoc)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	rows := map[string]metricRow{}
	for line := range strings.SplitSeq(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 4 || !strings.Contains(cells[1], "scorer_") {
			continue
		}
		for name, labels := range docMetrics(cells[1]) {
			if _, dup := rows[name]; dup {
				t.Errorf("%s's Metrics table lists %s twice", operatingDoc, name)
			}
			rows[name] = metricRow{labels: labels, text: line}
		}
	}
	return rows
}

// designMetrics parses the metric names and labels under docs/design.md's "## Metrics".
func designMetrics(t *testing.T) map[string][]string {
	t.Helper()
	data, err := os.ReadFile(designDoc)
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(data), "\n## Metrics")
	if !ok {
		t.Fatalf("%s has no ## Metrics section", designDoc)
	}
	section, _, _ = strings.Cut(section, "\n## ")
	return docMetrics(section)
}

// docMetrics returns each metric written in text with its sorted label names (values after '=' dropped).
func docMetrics(text string) map[string][]string {
	out := map[string][]string{}
	for _, m := range metricDocRe.FindAllStringSubmatch(text, -1) {
		labels := []string{}
		if m[2] != "" {
			for l := range strings.SplitSeq(m[2], ",") {
				name, _, _ := strings.Cut(strings.TrimSpace(l), "=")
				labels = append(labels, name)
			}
		}
		slices.Sort(labels)
		if prev, ok := out[m[1]]; !ok || len(labels) > len(prev) {
			out[m[1]] = labels
		}
	}
	return out
}

// dlqReasons returns every reason a dead letter can carry: schema's decode reasons (reasonNames, less
// "unknown", which DecodeEvent never returns) and the consumer's own Reason* constants.
func dlqReasons(t *testing.T) []string {
	t.Helper()
	var out []string
	f, err := parser.ParseFile(token.NewFileSet(), "../schema/errors.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	ast.Inspect(f, func(n ast.Node) bool {
		spec, ok := n.(*ast.ValueSpec)
		if !ok || len(spec.Names) != 1 || spec.Names[0].Name != "reasonNames" || len(spec.Values) != 1 {
			return true
		}
		if lit, ok := spec.Values[0].(*ast.CompositeLit); ok {
			for _, el := range lit.Elts {
				if kv, ok := el.(*ast.KeyValueExpr); ok {
					if v := stringLit(kv.Value); v != "" && v != "unknown" {
						out = append(out, v)
					}
				}
			}
		}
		return false
	})
	for _, v := range constStrings(t, "../consumer/pipeline.go", "Reason") {
		if !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// constStrings returns the string constants of a Go file whose names start with prefix.
func constStrings(t *testing.T, path, prefix string) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, d := range f.Decls {
		gd, ok := d.(*ast.GenDecl)
		if !ok || gd.Tok != token.CONST {
			continue
		}
		for _, s := range gd.Specs {
			vs := s.(*ast.ValueSpec)
			for i, n := range vs.Names {
				if strings.HasPrefix(n.Name, prefix) && i < len(vs.Values) {
					if v := stringLit(vs.Values[i]); v != "" {
						out = append(out, v)
					}
				}
			}
		}
	}
	return out
}
