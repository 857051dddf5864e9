package offline

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/cli"
	"github.com/scorer/scorer/internal/testenv"
)

// seedVersion is one row of a seed-shaped table: one version of a call.
type seedVersion struct {
	call, entity, at string
	version          int
	md               []string
}

// writeSeedPart writes rows as one Spark-named part file of the seed's
// table, in the seed's Parquet types (seedSelect), in the order given.
func writeSeedPart(t *testing.T, dir, name string, rows []seedVersion) {
	t.Helper()
	var b strings.Builder
	for _, r := range rows {
		rec := map[string]any{
			"CALL_ID": r.call, "COMPANY_NAME": r.entity + " Inc.", "CALL_NAME": "Earnings Call",
			"DATE": r.at[:10], "EVENT_DATETIME_UTC": r.at, "VERSION_ID": r.version, "FILT_MD": r.md, "FILT_QA": nil,
		}
		if r.entity != "" {
			rec["ENTITY_ID"] = r.entity
		}
		line, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	jsonl := filepath.Join(t.TempDir(), name+".jsonl")
	if err := os.WriteFile(jsonl, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	testenv.DuckDB(t, fmt.Sprintf("COPY (%s) TO '%s' (FORMAT parquet)", seedSelect(jsonl, ""), filepath.Join(dir, name)))
}

// backfillLoad is the load of migrating.md's step 3 as the guide prints
// it, for the key it names (the call, or OUTPUT_KEY=entity_event's), with
// the backfill file put in: the test runs the documented statements, not
// a copy of them.
func backfillLoad(t *testing.T, key, out string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(testenv.RepoRoot(), "docs", "migrating.md"))
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?s)<!-- load keyed on " + regexp.QuoteMeta(key) + " -->\\s*```sql\n(.*?)```")
	m := re.FindSubmatch(raw)
	if m == nil {
		t.Fatalf("docs/migrating.md has no sql block marked <!-- load keyed on %s -->", key)
	}
	sql := strings.ReplaceAll(string(m[1]), "/warehouse/scores_backfill.parquet", out)
	var stmts []string
	for _, s := range strings.Split(sql, ";") {
		if s = strings.TrimSpace(s); s != "" {
			stmts = append(stmts, s)
		}
	}
	return stmts
}

// scoreRowsTable is the results table of migrating.md's step 4, created
// ahead with the backfill's columns and the sink's primary key.
func scoreRowsTable(pk string) string {
	return `CREATE TABLE score_rows (call_id VARCHAR, section VARCHAR, sentence_index INTEGER, label VARCHAR,
		entity_id VARCHAR, event_time VARCHAR, version_id VARCHAR, sentence VARCHAR, score FLOAT, flag INTEGER,
		threshold DOUBLE, model_sha256 VARCHAR, pair_encoding VARCHAR, scored_at TIMESTAMPTZ, PRIMARY KEY (` + pk + `))`
}

// TestParquetBackfillKeepsNewestVersion: a table that holds several
// versions of a call holds them in whatever order its part files give
// (Spark's part numbers follow tasks, not versions). Here every older
// version comes last, and is longer. The backfill's rows must hold each
// key's newest version only (the greatest VERSION_ID, numerically: 10 is
// newer than 9), so that the documented load leaves the table as the
// stream leaves it once every version is consumed, with the rows of an
// older, longer version gone, also those a previous load put there; and
// under OUTPUT_KEY=entity_event the key is the event, whatever call_id
// each version has.
func TestParquetBackfillKeepsNewestVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("six scorer runs read back and loaded through DuckDB; make test runs it")
	}
	shareModels(t)
	env := testenv.ScorerEnv(t)
	long := []string{"Revenue grew eight percent.", "Margins were flat.", "We expect growth next year."}
	table := filepath.Join(t.TempDir(), "transcripts")
	if err := os.Mkdir(table, 0o755); err != nil {
		t.Fatal(err)
	}
	const q1, q2, q3 = "2021-03-01T21:30:00Z", "2021-06-01T21:30:00Z", "2021-09-01T21:30:00Z"
	newer := []seedVersion{
		{"ACME-Q1", "ACME", q1, 2, long[:1]},
		{"INI-Q2-final", "INI", q2, 3, long[1:2]},
		{"NUM-Q3", "NUM", q3, 10, long[2:]},
	}
	older := []seedVersion{
		{"INI-Q2-prelim", "INI", q2, 1, long},
		{"NUM-Q3", "NUM", q3, 9, long},
		{"ACME-Q1", "ACME", q1, 1, long},
	}
	writeSeedPart(t, table, "part-00000-5e1f-c000.snappy.parquet", newer)
	writeSeedPart(t, table, "part-00001-5e1f-c000.snappy.parquet", older)
	// A previous load: the history as it stood before the newer versions.
	before := filepath.Join(t.TempDir(), "before")
	if err := os.Mkdir(before, 0o755); err != nil {
		t.Fatal(err)
	}
	writeSeedPart(t, before, "part-00000.parquet", older)

	with := func(key string) map[string]string {
		e := map[string]string{"OUTPUT_KEY": key}
		for k, v := range env {
			e[k] = v
		}
		return e
	}
	score := func(t *testing.T, e map[string]string, in string, extra ...string) string {
		t.Helper()
		out := filepath.Join(t.TempDir(), "scores_backfill.parquet")
		_, stderr, err := runCLI(t, e, "", append([]string{"score", "--in", in, "--out", out}, extra...)...)
		if err != nil {
			t.Fatalf("score --in %s: %v\n%s", filepath.Base(in), err, testenv.Tail(stderr, 2000))
		}
		return out
	}
	// versions is call_id -> "version_id: sentences" of a query's rows.
	versions := func(t *testing.T, stmts ...string) map[string]string {
		t.Helper()
		got := map[string]string{}
		for _, r := range testenv.DuckDB(t, stmts...) {
			got[r["call_id"].(string)] = fmt.Sprintf("%v: %v", r["version_id"], r["sentences"])
		}
		return got
	}
	const perCall = "SELECT call_id, string_agg(DISTINCT version_id, ',') AS version_id, count(DISTINCT sentence_index) AS sentences"

	for _, c := range []struct {
		key, pk string
		want    map[string]string
	}{
		{"call_id", "call_id, section, sentence_index, label",
			map[string]string{"ACME-Q1": "2: 1", "INI-Q2-final": "3: 1", "INI-Q2-prelim": "1: 3", "NUM-Q3": "10: 1"}},
		{"entity_event", "entity_id, event_time, section, sentence_index, label",
			map[string]string{"ACME-Q1": "2: 1", "INI-Q2-final": "3: 1", "NUM-Q3": "10: 1"}},
	} {
		t.Run(c.key, func(t *testing.T) {
			e := with(c.key)
			out := score(t, e, table)
			got := versions(t, fmt.Sprintf("%s FROM read_parquet('%s') GROUP BY call_id", perCall, out))
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("the backfill's rows hold, per call (version: sentences), %v\nwant %v", got, c.want)
			}
			stmts := []string{scoreRowsTable(c.pk)}
			stmts = append(stmts, backfillLoad(t, c.key, score(t, e, before))...)
			stmts = append(stmts, backfillLoad(t, c.key, out)...)
			stmts = append(stmts, backfillLoad(t, c.key, out)...) // loading twice changes nothing
			got = versions(t, append(stmts, perCall+" FROM score_rows GROUP BY call_id")...)
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("after the documented loads the table holds, per call, %v\nwant %v", got, c.want)
			}
		})
	}

	t.Run("entity_event without an entity is a bad row", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "noentity")
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		writeSeedPart(t, dir, "part-00000.parquet", []seedVersion{newer[0], {"NOENT-Q4", "", q3, 1, long[:1]}})
		out := filepath.Join(t.TempDir(), "scores.parquet")
		_, _, err := runCLI(t, with("entity_event"), "", "score", "--in", dir, "--out", out)
		if err == nil || !strings.Contains(err.Error(), "row 2") || !strings.Contains(err.Error(), "NOENT-Q4") || !strings.Contains(err.Error(), "entity_event") {
			t.Fatalf("err = %v, want one naming row 2, NOENT-Q4 and entity_event", err)
		}
		_, stderr, err := runCLI(t, with("entity_event"), "", "score", "--in", dir, "--out", out, "--skip-bad")
		if err != nil || !strings.Contains(stderr, `"reason":"output_rejected"`) || !strings.Contains(stderr, `"row":2`) {
			t.Fatalf("--skip-bad: %v, want row 2 reported as output_rejected\n%s", err, testenv.Tail(stderr, 2000))
		}
		if got := versions(t, fmt.Sprintf("%s FROM read_parquet('%s') GROUP BY call_id", perCall, out)); fmt.Sprint(got) != "map[ACME-Q1:2: 1]" {
			t.Errorf("rows %v, want ACME-Q1's only", got)
		}
	})

	t.Run("Parquet rows from stdin are refused", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "scores.parquet")
		_, _, err := runCLI(t, env, "", "score", "--out", out)
		if cli.ExitCode(err) != 2 || !strings.Contains(err.Error(), "newest version") {
			t.Errorf("stdin to Parquet rows: %v (exit %d), want a usage error naming the newest version", err, cli.ExitCode(err))
		}
	})
}
