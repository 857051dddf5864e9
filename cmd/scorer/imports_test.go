package main

import (
	"bufio"
	"bytes"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/scorer/scorer/consumer"
	"github.com/scorer/scorer/gpupool"
	"github.com/scorer/scorer/internal/fanout"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model"
)

const module = "github.com/scorer/scorer/"

// ortBinding is ONNX Runtime's Go binding.
const ortBinding = "github.com/yalue/onnxruntime_go"

// chainLinks are the scoring chain's interfaces, each met by the next
// package down: consumer → fan-out → gpupool → model.
var (
	_ consumer.Scorer   = (*fanout.TranscriptScorer)(nil)
	_ fanout.PairScorer = (*gpupool.Pool)(nil)
	_ gpupool.Engine    = (*model.Session)(nil)
)

// TestImportsRunOneWay: cmd → internal/* → consumer, producer, and the
// scoring chain consumer → transcript fan-out (internal/fanout) → gpupool →
// model → ONNX Runtime environment (model/ortenv) → schema. consumer and
// producer know only schema (and internal/retry, the one backoff, a leaf
// that imports nothing of the module); the consumer reaches the fan-out
// through its Scorer interface, the fan-out the pool through PairScorer,
// the pool a session through Engine (chainLinks checks each at compile
// time). The fan-out imports only model, schema and its own scorecache,
// never gpupool; gpupool only model, model/ortenv (the signal guard, the
// host checks) and schema; model only schema and its own subpackages;
// model/ortenv nothing of the module; model/onnxgraph (graph surgery,
// shared by model and internal/onnxfp16) only model/onnxpb, never model
// itself. Only model and model/ortenv import ONNX Runtime's Go binding
// (tools and tests aside). Nothing outside internal/ imports it but the
// binary and its tools; only the binary imports internal/service (`scorer
// run`), and no package under internal/ calls another subcommand's entry
// point (Command) or takes its Spec: what subcommands share lives in cli,
// config, scoring, broker and produce's libraries.
func TestImportsRunOneWay(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{join .Imports \" \"}}", "./...")
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	allowed := map[string][]string{ // package prefix → module packages it may import (prefixes)
		"schema":          {},
		"model":           {"schema", "model/"},
		"model/onnxgraph": {"model/onnxpb"},
		"model/ortenv":    {},
		"gpupool":         {"model", "model/ortenv", "schema"},
		"internal/fanout": {"model", "schema", "internal/fanout/"},
		"consumer":        {"schema", "internal/retry"},
		"producer":        {"schema", "internal/retry"},
		"internal/retry":  {},
	}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		pkg := strings.TrimPrefix(f[0], module)
		for _, imp := range f[1:] {
			if imp == ortBinding && pkg != "model" && pkg != "model/ortenv" && !strings.HasPrefix(pkg, "tools/") {
				t.Errorf("%s imports %s: only model and model/ortenv (the ONNX Runtime environment) may", pkg, imp)
			}
			if !strings.HasPrefix(imp, module) {
				continue
			}
			imp = strings.TrimPrefix(imp, module)
			for layer, ok := range allowed {
				if pkg != layer && !strings.HasPrefix(pkg, layer+"/") {
					continue
				}
				if !hasPrefix(imp, ok) {
					t.Errorf("%s imports %s; it may import only %v", pkg, imp, ok)
				}
			}
			internalPkg := strings.HasPrefix(imp, "internal/")
			if internalPkg && imp != "internal/retry" && !strings.HasPrefix(pkg, "internal/") && !strings.HasPrefix(pkg, "cmd/") && !strings.HasPrefix(pkg, "tools/") {
				t.Errorf("%s imports %s: only the binary, its tools and internal/ may", pkg, imp)
			}
			if imp == "internal/service" && pkg != "cmd/scorer" {
				t.Errorf("%s imports internal/service, which is `scorer run` alone", pkg)
			}
		}
	}

	// No internal package refers to a sibling's Command or Spec.
	files, err := filepath.Glob(filepath.Join(testenv.RepoRoot(), "internal", "*", "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		af, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			t.Fatal(err)
		}
		siblings := map[string]bool{}
		for _, im := range af.Imports {
			path := strings.Trim(im.Path.Value, `"`)
			if strings.HasPrefix(path, module+"internal/") {
				name := filepath.Base(path)
				if im.Name != nil {
					name = im.Name.Name
				}
				siblings[name] = true
			}
		}
		ast.Inspect(af, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if id, ok := sel.X.(*ast.Ident); ok && siblings[id.Name] && id.Name != "cli" && (sel.Sel.Name == "Command" || sel.Sel.Name == "Spec") {
					t.Errorf("%s: %s.%s: a subcommand's entry point belongs to the binary alone", fset.Position(sel.Pos()), id.Name, sel.Sel.Name)
				}
			}
			return true
		})
	}
}

func hasPrefix(s string, prefixes []string) bool {
	for _, p := range prefixes {
		if s == p || strings.HasSuffix(p, "/") && strings.HasPrefix(s, p) {
			return true
		}
	}
	return false
}

// TestOneBuilder: scoring.Open is the only way from the settings to a pool
// and a scorer, so no package but internal/scoring calls gpupool.New, opens
// NVML (gpupool.NewNVMLProbe) or starts ONNX Runtime (ortenv.InitRuntime);
// gpupool and model themselves, and tests, aside. A command that built its
// own pool would measure a scorer the service never runs (bench did: no
// score cache, no topic sizing) and break the rule only scoring.Runtime
// keeps: after a pool that did not finish closing, never unload NVML or ORT.
func TestOneBuilder(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", "{{.ImportPath}} {{.Dir}} {{join .GoFiles \" \"}} {{join .CgoFiles \" \"}}", "./...")
	cmd.Dir = testenv.RepoRoot()
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	builders := map[string]map[string]bool{ // import path → its functions only internal/scoring calls
		module + "gpupool":      {"New": true, "NewNVMLProbe": true},
		module + "model/ortenv": {"InitRuntime": true},
	}
	fset := token.NewFileSet()
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		pkg := strings.TrimPrefix(f[0], module)
		if pkg == "internal/scoring" || pkg == "gpupool" || strings.HasPrefix(pkg, "gpupool/") || pkg == "model" || strings.HasPrefix(pkg, "model/") {
			continue
		}
		for _, name := range f[2:] {
			af, err := parser.ParseFile(fset, filepath.Join(f[1], name), nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatal(err)
			}
			local := map[string]map[string]bool{} // the file's name for a builder package → its builders
			for _, im := range af.Imports {
				path := strings.Trim(im.Path.Value, `"`)
				if fns, ok := builders[path]; ok {
					n := filepath.Base(path)
					if im.Name != nil {
						n = im.Name.Name
					}
					local[n] = fns
				}
			}
			ast.Inspect(af, func(n ast.Node) bool {
				if sel, ok := n.(*ast.SelectorExpr); ok {
					if id, ok := sel.X.(*ast.Ident); ok && local[id.Name][sel.Sel.Name] {
						t.Errorf("%s: %s.%s: only internal/scoring builds pools and starts NVML and ONNX Runtime; use scoring.Open (and a scoring.Runtime)",
							fset.Position(sel.Pos()), id.Name, sel.Sel.Name)
					}
				}
				return true
			})
		}
	}
}
