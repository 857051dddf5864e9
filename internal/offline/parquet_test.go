package offline

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/parquet-go/parquet-go"
	"github.com/parquet-go/parquet-go/deprecated"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/schema"
)

// pyList writes sentences as Python's str() of a list writes them, the
// form the seed's FILT_* string columns hold.
func pyList(ss []string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, s := range ss {
		if i > 0 {
			b.WriteString(", ")
		}
		q := '\''
		if strings.ContainsRune(s, '\'') && !strings.ContainsRune(s, '"') {
			q = '"'
		}
		b.WriteRune(q)
		for _, r := range s {
			switch {
			case r == '\\' || r == q:
				b.WriteByte('\\')
				b.WriteRune(r)
			case r == '\n':
				b.WriteString(`\n`)
			case r == '\r':
				b.WriteString(`\r`)
			case r == '\t':
				b.WriteString(`\t`)
			case r < 0x20 || r == 0x7f:
				fmt.Fprintf(&b, `\x%02x`, r)
			default:
				b.WriteRune(r)
			}
		}
		b.WriteRune(q)
	}
	b.WriteByte(']')
	return b.String()
}

// seedTable writes the seed job's input table for events as JSON lines in
// the seed's columns (FILT_MD a list, FILT_QA a Python list literal,
// DATE, EVENT_DATETIME_UTC, VERSION_ID, and nulls on some rows), with a row
// whose CALL_ID is null at badAt (-1: none). It returns the file.
func seedTable(t *testing.T, dir string, events []schema.TranscriptEvent, badAt int) string {
	t.Helper()
	var b strings.Builder
	for i, ev := range events {
		if i == badAt {
			b.WriteString(`{"CALL_ID": null, "FILT_MD": ["A row without a call."]}` + "\n")
		}
		md, qa := ev.Sections["FILT_MD"], ev.Sections["FILT_QA"]
		rec := map[string]any{
			"CALL_ID": ev.CallID, "ENTITY_ID": ev.EntityID, "COMPANY_NAME": ev.CompanyName,
			"CALL_NAME": fmt.Sprintf("Q%d %d Earnings Call", i%4+1, 2021), "VERSION_ID": i + 1,
			"DATE":               fmt.Sprintf("2021-03-%02d", i+1),
			"EVENT_DATETIME_UTC": fmt.Sprintf("2021-03-%02dT21:30:%02d.123456Z", i+1, i),
			"FILT_MD":            md, "FILT_QA": pyList(qa),
		}
		switch i % 3 {
		case 1: // no time of day: the DATE column stands in, as in the seed
			rec["ENTITY_ID"], rec["EVENT_DATETIME_UTC"], rec["VERSION_ID"] = nil, nil, nil
		case 2:
			rec["CALL_NAME"] = nil
			if len(qa) > 0 {
				rec["FILT_MD"] = nil
			}
		}
		line, err := json.Marshal(rec)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	path := filepath.Join(dir, "seed.jsonl")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// seedSelect reads a seedTable file into DuckDB with the seed's Parquet
// types: DATE, TIMESTAMP, BIGINT, LIST<VARCHAR>, VARCHAR.
func seedSelect(jsonl string, where string) string {
	return fmt.Sprintf(`SELECT CALL_ID, ENTITY_ID, COMPANY_NAME, CALL_NAME, CAST(DATE AS DATE) AS DATE,
		CAST(EVENT_DATETIME_UTC AS TIMESTAMP) AS EVENT_DATETIME_UTC, VERSION_ID, FILT_MD, FILT_QA
		FROM read_json('%s', format = 'newline_delimited', columns = {CALL_ID: 'VARCHAR', ENTITY_ID: 'VARCHAR',
		COMPANY_NAME: 'VARCHAR', CALL_NAME: 'VARCHAR', DATE: 'VARCHAR', EVENT_DATETIME_UTC: 'VARCHAR',
		VERSION_ID: 'BIGINT', FILT_MD: 'VARCHAR[]', FILT_QA: 'VARCHAR'}) %s`, jsonl, where)
}

// outRow is one row of the scorer's Parquet output as DuckDB reads it.
type outRow struct {
	key   string
	cols  map[string]any
	score float64
}

// readRows reads a Parquet output with DuckDB, in file order, checking its
// column types.
func readRows(t *testing.T, path string) []outRow {
	t.Helper()
	types := map[string]string{}
	for _, r := range testenv.DuckDB(t, fmt.Sprintf("DESCRIBE SELECT * FROM read_parquet('%s')", path)) {
		types[r["column_name"].(string)] = r["column_type"].(string)
	}
	want := map[string]string{
		"call_id": "VARCHAR", "section": "VARCHAR", "sentence_index": "INTEGER", "label": "VARCHAR",
		"entity_id": "VARCHAR", "event_time": "VARCHAR", "version_id": "VARCHAR", "sentence": "VARCHAR",
		"score": "FLOAT", "flag": "INTEGER", "threshold": "DOUBLE", "model_sha256": "VARCHAR",
		"pair_encoding": "VARCHAR", "scored_at": "TIMESTAMP WITH TIME ZONE",
	}
	if !reflect.DeepEqual(types, want) {
		t.Errorf("DuckDB reads the columns as %v, want %v", types, want)
	}
	var out []outRow
	for _, r := range testenv.DuckDB(t, fmt.Sprintf("SELECT * EXCLUDE (scored_at), epoch_ms(scored_at) AS scored_ms FROM read_parquet('%s')", path)) {
		score, err := r["score"].(json.Number).Float64()
		if err != nil {
			t.Fatal(err)
		}
		// BIGINT comes as a string, to keep its 64 bits.
		if ms, _ := strconv.ParseInt(fmt.Sprint(r["scored_ms"]), 10, 64); ms <= 0 {
			t.Errorf("scored_at %v", r["scored_ms"])
		}
		delete(r, "score")
		delete(r, "scored_ms")
		out = append(out, outRow{key: fmt.Sprint(r["call_id"], "/", r["section"], "/", r["sentence_index"], "/", r["label"]), cols: r, score: score})
	}
	return out
}

// wantRows is the JSONL path's output flattened as the rows topic flattens
// it, in the DuckDB form of readRows.
func wantRows(t *testing.T, scored []schema.ScoredTranscript, sentences map[string][]string) []outRow {
	t.Helper()
	var out []outRow
	for i := range scored {
		st := scored[i]
		for name, sec := range st.Sections {
			sec.Text = sentences[st.CallID+"/"+name]
			st.Sections[name] = sec
		}
		for _, r := range schema.Rows(&st) {
			null := func(s string) any {
				if s == "" {
					return nil
				}
				return s
			}
			cols := map[string]any{
				"call_id": r.CallID, "section": r.Section, "sentence_index": json.Number(strconv.Itoa(r.SentenceIndex)), "label": r.Label,
				"entity_id": null(r.EntityID), "event_time": null(r.EventTime), "version_id": null(r.VersionID), "sentence": r.Sentence,
				"flag": json.Number(strconv.Itoa(r.Flag)), "threshold": json.Number(strconv.FormatFloat(r.Threshold, 'g', -1, 64)),
				"model_sha256": r.ModelSHA256, "pair_encoding": r.PairEncoding,
			}
			out = append(out, outRow{key: fmt.Sprint(r.CallID, "/", r.Section, "/", r.SentenceIndex, "/", r.Label), cols: cols, score: float64(r.Score)})
		}
	}
	return out
}

func equalRows(t *testing.T, what string, got, want []outRow) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("%s: %d rows, want %d", what, len(got), len(want))
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.key != w.key || !reflect.DeepEqual(g.cols, w.cols) {
			t.Fatalf("%s: row %d\n got %v\nwant %v", what, i, g.cols, w.cols)
		}
		// Two runs batch pairs differently, which may move the last bits.
		if math.Abs(g.score-w.score) > 1e-5 {
			t.Fatalf("%s: row %d (%s) score %v, want %v", what, i, g.key, g.score, w.score)
		}
	}
}

// TestParquetBackfill is a backfill as the migration guide runs it:
// DuckDB writes the seed job's table (list and Python-literal sentence
// columns, DATE, TIMESTAMP, nulls, a bad row) as one file and as a folder
// of Spark-named part files; `scorer score` scores it to Parquet rows;
// DuckDB reads them back, and every row equals the JSONL path's output
// for the same table, score for score.
func TestParquetBackfill(t *testing.T) {
	if testing.Short() {
		t.Skip("a whole backfill (seven scorer runs) read back through DuckDB; make test runs it (-short keeps TestParquetInputTypes' decoding)")
	}
	shareModels(t)
	env := testenv.ScorerEnv(t)
	_, events := testenv.ShortestTranscriptsLean(t, 6)
	dir := t.TempDir()
	seed := seedTable(t, dir, events, 3) // row 4 has no CALL_ID
	table := filepath.Join(dir, "seed.parquet")
	testenv.DuckDB(t, fmt.Sprintf("COPY (%s) TO '%s' (FORMAT parquet)", seedSelect(seed, ""), table))
	sentences := map[string][]string{}
	for _, ev := range events {
		for name, s := range ev.Sections {
			sentences[ev.CallID+"/"+name] = s
		}
	}

	// The JSONL path over the same table as JSON lines.
	wantFile := filepath.Join(dir, "want.jsonl")
	if _, stderr, err := runCLI(t, env, "", "score", "--in", seed, "--out", wantFile, "--skip-bad"); err != nil {
		t.Fatalf("JSONL path: %v\n%s", err, stderr)
	}
	want := wantRows(t, testenv.ReadJSONL[schema.ScoredTranscript](t, wantFile), sentences)
	if len(want) == 0 {
		t.Fatal("the JSONL path wrote no rows")
	}

	t.Run("a file in, Parquet rows out", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "scores.parquet")
		_, stderr, err := runCLI(t, env, "", "score", "--in", table, "--out", out, "--skip-bad")
		if err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		equalRows(t, "Parquet rows", readRows(t, out), want)
		// The bad row is reported where a bad line is, by file and row.
		if !strings.Contains(stderr, `"file":"seed.parquet"`) || !strings.Contains(stderr, `"row":4`) || !strings.Contains(stderr, `"reason":"missing_field"`) {
			t.Errorf("bad-row report missing from stderr:\n%s", testenv.Tail(stderr, 2000))
		}
		kv := testenv.DuckDB(t, fmt.Sprintf("SELECT decode(value) AS v FROM parquet_kv_metadata('%s') WHERE decode(key) = 'scorer.settings'", out))
		if len(kv) != 1 || !strings.Contains(kv[0]["v"].(string), `"pair_encoding":"pair"`) {
			t.Errorf("footer settings: %v", kv)
		}
	})

	t.Run("a bad row without --skip-bad stops the run naming it", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "scores.parquet")
		_, _, err := runCLI(t, env, "", "score", "--in", table, "--out", out)
		if err == nil || !strings.Contains(err.Error(), "seed.parquet row 4") || !strings.Contains(err.Error(), "call_id") {
			t.Fatalf("err = %v, want one naming seed.parquet row 4 and call_id", err)
		}
		if _, err := os.Stat(out); err == nil {
			t.Error("--out written by a failed run")
		}
	})

	t.Run("a folder of part files as Spark writes them", func(t *testing.T) {
		parts := filepath.Join(t.TempDir(), "seed_table")
		if err := os.Mkdir(parts, 0o755); err != nil {
			t.Fatal(err)
		}
		var stmts []string
		for p := range 3 {
			name := filepath.Join(parts, fmt.Sprintf("part-%05d-0c1d2e3f-c000.snappy.parquet", p))
			stmts = append(stmts, fmt.Sprintf("COPY (SELECT * EXCLUDE (n) FROM (SELECT *, row_number() OVER () AS n FROM (%s)) WHERE (n - 1) // 3 = %d ORDER BY n) TO '%s' (FORMAT parquet, COMPRESSION snappy)",
				seedSelect(seed, ""), p, name))
		}
		testenv.DuckDB(t, stmts...)
		for _, f := range []string{"_SUCCESS", ".part-00000-0c1d2e3f-c000.snappy.parquet.crc"} {
			if err := os.WriteFile(filepath.Join(parts, f), []byte("not a part"), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		out := filepath.Join(t.TempDir(), "scores.parquet")
		if _, stderr, err := runCLI(t, env, "", "score", "--in", parts, "--out", out, "--skip-bad"); err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		equalRows(t, "from part files", readRows(t, out), want)
	})

	t.Run("Hive partition folders give their column", func(t *testing.T) {
		hive := filepath.Join(t.TempDir(), "by_date")
		testenv.DuckDB(t, fmt.Sprintf("COPY (%s) TO '%s' (FORMAT parquet, PARTITION_BY (DATE))", seedSelect(seed, "WHERE CALL_ID IS NOT NULL"), hive))
		out := filepath.Join(t.TempDir(), "scores.parquet")
		if _, stderr, err := runCLI(t, env, "", "score", "--in", hive, "--out", out); err != nil {
			t.Fatalf("%v\n%s", err, stderr)
		}
		got := map[string]any{}
		for _, r := range readRows(t, out) {
			got[r.cols["call_id"].(string)] = r.cols["event_time"]
		}
		for i, ev := range events {
			want := fmt.Sprintf("2021-03-%02dT21:30:%02d.123456Z", i+1, i)
			if i%3 == 1 {
				want = fmt.Sprintf("2021-03-%02d", i+1) // DATE, from the folder name
			}
			if got[ev.CallID] != want {
				t.Errorf("%s: event_time %v, want %s", ev.CallID, got[ev.CallID], want)
			}
		}
	})

	t.Run("--resume with Parquet output", func(t *testing.T) {
		out := filepath.Join(t.TempDir(), "scores.parquet")
		partial := out + partialSuffix
		// The first run stops at the bad row, keeping the three before it.
		_, _, err := runCLI(t, env, "", "score", "--in", table, "--out", out, "--resume", "--chunk", "1")
		if err == nil || !strings.Contains(err.Error(), "row 4") {
			t.Fatalf("first run: %v, want a stop at row 4", err)
		}
		ents, _ := os.ReadDir(partial)
		if len(ents) == 0 {
			t.Fatalf("no parts kept in %s", partial)
		}
		// Another threshold is refused, naming it.
		e := map[string]string{"THRESHOLD": "0.5"}
		for k, v := range env {
			e[k] = v
		}
		fixed := filepath.Join(t.TempDir(), "fixed.parquet")
		testenv.DuckDB(t, fmt.Sprintf("COPY (%s) TO '%s' (FORMAT parquet)", seedSelect(seed, "WHERE CALL_ID IS NOT NULL"), fixed))
		if _, _, err := runCLI(t, e, "", "score", "--in", fixed, "--out", out, "--resume"); err == nil || !strings.Contains(err.Error(), "threshold") {
			t.Fatalf("resume with another threshold: %v", err)
		}
		// The same settings skip the kept transcripts and finish.
		_, stderr, err := runCLI(t, env, "", "score", "--in", fixed, "--out", out, "--resume", "--progress", "on")
		if err != nil {
			t.Fatalf("resumed run: %v\n%s", err, stderr)
		}
		if !strings.Contains(stderr, "3 skipped") {
			t.Errorf("the resumed run did not skip the 3 kept transcripts:\n%s", testenv.Tail(stderr, 800))
		}
		equalRows(t, "resumed", readRows(t, out), want)
		if _, err := os.Stat(partial); err == nil {
			t.Error("the partial folder is still there")
		}
	})
}

// TestParquetRowMatchesScoreRow keeps the Parquet output's columns those
// of the rows topic (schema.ScoreRow's JSON names, in order).
func TestParquetRowMatchesScoreRow(t *testing.T) {
	var want []string
	rt := reflect.TypeFor[schema.ScoreRow]()
	for i := range rt.NumField() {
		name, _, _ := strings.Cut(rt.Field(i).Tag.Get("json"), ",")
		want = append(want, name)
	}
	var got []string
	for _, f := range parquet.SchemaOf(parquetRow{}).Fields() {
		got = append(got, f.Name())
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parquet columns %v, rows topic %v", got, want)
	}
}

// readEvents decodes every record of a Parquet input as `scorer score`
// does, returning the events and the errors of bad rows.
func readEvents(t *testing.T, path string) ([]schema.TranscriptEvent, []error) {
	t.Helper()
	src, err := openSource(path, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.close()
	var evs []schema.TranscriptEvent
	var errs []error
	for {
		rec, err := src.next()
		if errors.Is(err, io.EOF) {
			return evs, errs
		}
		if err != nil {
			t.Fatal(err)
		}
		if rec.err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", rec.where, rec.err))
			continue
		}
		ev, err := schema.DecodeEvent(rec.data, schema.DefaultLimits())
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", rec.where, err))
			continue
		}
		evs = append(evs, ev)
	}
}

// TestParquetInputTypes: the lower-case shape with `sections` as a
// MAP<VARCHAR, VARCHAR[]>, IDs as DECIMAL and INTEGER (kept as their exact
// text, as the JSON path keeps numeric IDs), a struct column the decoder
// does not read (left out), and null elements and maps as bad rows.
func TestParquetInputTypes(t *testing.T) {
	path := filepath.Join(t.TempDir(), "lower.parquet")
	testenv.DuckDB(t, fmt.Sprintf(`COPY (SELECT * FROM (VALUES
		(123456789012345678901234567890::DECIMAL(38,0), 42, 12.50::DECIMAL(10,2), '2021-03-04', MAP {'FILT_MD': ['One.', 'Two.'], 'EMPTY': []}, {'a': 1}),
		(-7::DECIMAL(38,0), NULL, NULL, NULL, MAP {'FILT_QA': ['Fine.', NULL]}, NULL),
		(8::DECIMAL(38,0), NULL, NULL, NULL, NULL, NULL)
	) v(call_id, entity_id, version_id, event_time, sections, extra)) TO '%s' (FORMAT parquet)`, path))
	evs, errs := readEvents(t, path)
	if len(evs) != 1 || len(errs) != 2 {
		t.Fatalf("%d events, errors %v; want 1 and 2", len(evs), errs)
	}
	ev := evs[0]
	if ev.CallID != "123456789012345678901234567890" || ev.EntityID != "42" || ev.VersionID != "12.50" || ev.EventTime != "2021-03-04" ||
		!reflect.DeepEqual(ev.Sections, map[string][]string{"FILT_MD": {"One.", "Two."}, "EMPTY": {}}) {
		t.Errorf("event %+v", ev)
	}
	if !strings.Contains(errs[0].Error(), "lower.parquet row 2") || !strings.Contains(errs[0].Error(), "sections.FILT_QA[1]") {
		t.Errorf("null sentence: %v", errs[0])
	}
	if !strings.Contains(errs[1].Error(), "row 3") || !strings.Contains(errs[1].Error(), "missing_field") {
		t.Errorf("null sections: %v", errs[1])
	}

	// Spark's legacy INT96 timestamps (DuckDB does not write them; parquet-go does).
	type legacy struct {
		CallID string           `parquet:"CALL_ID"`
		Time   deprecated.Int96 `parquet:"EVENT_DATETIME_UTC"`
		MD     []string         `parquet:"FILT_MD,list"`
	}
	at := time.Date(2020, 11, 23, 21, 30, 0, 123456789, time.UTC)
	nanos := uint64(at.Sub(time.Date(2020, 11, 23, 0, 0, 0, 0, time.UTC)))
	julian := uint32(at.Unix()/86400 + 2440588)
	legacyPath := filepath.Join(t.TempDir(), "int96.parquet")
	if err := parquet.WriteFile(legacyPath, []legacy{{"A-1", deprecated.Int96{uint32(nanos), uint32(nanos >> 32), julian}, []string{"Hi."}}}); err != nil {
		t.Fatal(err)
	}
	evs, errs = readEvents(t, legacyPath)
	if len(errs) != 0 || len(evs) != 1 || evs[0].EventTime != "2020-11-23T21:30:00.123456789Z" || evs[0].CallID != "A-1" {
		t.Errorf("INT96: %+v %v", evs, errs)
	}

	// A column the decoder reads, in a shape it cannot: an error at open.
	nested := filepath.Join(t.TempDir(), "nested.parquet")
	testenv.DuckDB(t, fmt.Sprintf(`COPY (SELECT 'A' AS CALL_ID, [['x']] AS FILT_MD) TO '%s' (FORMAT parquet)`, nested))
	if _, err := openSource(nested, nil); err == nil || !strings.Contains(err.Error(), "FILT_MD") {
		t.Errorf("a LIST of LISTs for FILT_MD: %v", err)
	}
	// A folder without part files.
	if _, err := openSource(t.TempDir(), nil); err == nil || !strings.Contains(err.Error(), "no .parquet files") {
		t.Errorf("an empty folder: %v", err)
	}
}
