package testenv

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// DuckDB runs SQL statements in an in-memory DuckDB (tools/duckdb/query.mjs,
// installed by `make duckdb`) and returns the rows of the last statement,
// numbers as json.Number. It is the independent engine that writes and
// reads Parquet in tests.
func DuckDB(t testing.TB, statements ...string) []map[string]any {
	t.Helper()
	dir := filepath.Join(RepoRoot(), "tools", "duckdb")
	if _, err := os.Stat(filepath.Join(dir, "node_modules", "@duckdb", "node-api")); err != nil {
		t.Fatalf("DuckDB is not installed under %s (run `make duckdb`): %v", dir, err)
	}
	node, err := exec.LookPath("node")
	if err != nil {
		t.Fatalf("node not found (DuckDB runs under Node.js): %v", err)
	}
	cmd := exec.Command(node, append([]string{filepath.Join(dir, "query.mjs")}, statements...)...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("duckdb: %v\n%s\nstatements: %q", err, stderr.String(), statements)
	}
	var rows []map[string]any
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(make([]byte, 1<<20), 256<<20)
	for sc.Scan() {
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.UseNumber()
		var row map[string]any
		if err := dec.Decode(&row); err != nil {
			t.Fatalf("duckdb output line %q: %v", sc.Text(), err)
		}
		rows = append(rows, row)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}
