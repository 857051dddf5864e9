package offline

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/parquet-go/parquet-go"

	"github.com/scorer/scorer/schema"
)

// sink takes scored transcripts in input order. checkpoint runs after each
// chunk (--resume makes the chunk durable there); finish completes the
// format (buffers flushed, Parquet's footer) and leaves committing the file
// to its owner.
type sink interface {
	write(scored []schema.ScoredTranscript) error
	checkpoint() error
	finish() error
}

// jsonlSink writes one ScoredTranscript JSON per line. With a file and
// durable set, checkpoint flushes and fsyncs it.
type jsonlSink struct {
	bw      *bufio.Writer
	enc     *json.Encoder
	f       *os.File
	durable bool
}

func newJSONLSink(w io.Writer) *jsonlSink {
	bw := bufio.NewWriterSize(w, 1<<20)
	enc := json.NewEncoder(bw)
	enc.SetEscapeHTML(false)
	s := &jsonlSink{bw: bw, enc: enc}
	s.f, _ = w.(*os.File)
	return s
}

func (s *jsonlSink) write(scored []schema.ScoredTranscript) error {
	for i := range scored {
		if err := s.enc.Encode(&scored[i]); err != nil {
			return err
		}
	}
	return nil
}

func (s *jsonlSink) checkpoint() error {
	if !s.durable {
		return nil
	}
	if err := s.bw.Flush(); err != nil {
		return err
	}
	return s.f.Sync()
}

func (s *jsonlSink) finish() error { return s.bw.Flush() }

// parquetRow is schema.ScoreRow as a Parquet row: the rows topic's columns
// in its order (TestParquetRowMatchesScoreRow keeps them equal), with
// Parquet's own types: 32-bit integers, FLOAT scores, a DOUBLE threshold,
// scored_at a UTC TIMESTAMP(MILLIS), the fields the rows topic leaves out
// when empty nullable. Spark, DuckDB and pandas read every one of these
// types. Repetitive strings are dictionary-encoded.
type parquetRow struct {
	CallID        string    `parquet:"call_id,dict"`
	Section       string    `parquet:"section,dict"`
	SentenceIndex int32     `parquet:"sentence_index"`
	Label         string    `parquet:"label,dict"`
	EntityID      *string   `parquet:"entity_id,optional,dict"`
	EventTime     *string   `parquet:"event_time,optional,dict"`
	VersionID     *string   `parquet:"version_id,optional,dict"`
	Sentence      string    `parquet:"sentence"`
	Score         float32   `parquet:"score"`
	Flag          int32     `parquet:"flag"`
	Threshold     float64   `parquet:"threshold"`
	ModelSHA256   string    `parquet:"model_sha256,dict"`
	PairEncoding  string    `parquet:"pair_encoding,dict"`
	ScoredAt      time.Time `parquet:"scored_at,timestamp(millisecond)"`
}

func optional(s string) *string {
	if s == "" {
		return nil
	}
	return &s
}

func parquetRowOf(r *schema.ScoreRow) (parquetRow, error) {
	at, err := time.Parse(time.RFC3339Nano, r.ScoredAt)
	if err != nil {
		return parquetRow{}, fmt.Errorf("scored_at %q: %w", r.ScoredAt, err)
	}
	return parquetRow{
		CallID: r.CallID, Section: r.Section, SentenceIndex: int32(r.SentenceIndex), Label: r.Label,
		EntityID: optional(r.EntityID), EventTime: optional(r.EventTime), VersionID: optional(r.VersionID),
		Sentence: r.Sentence, Score: r.Score, Flag: int32(r.Flag), Threshold: r.Threshold,
		ModelSHA256: r.ModelSHA256, PairEncoding: r.PairEncoding, ScoredAt: at.UTC(),
	}, nil
}

// Parquet layout. A row group is written whenever it holds
// parquetRowGroupRows rows, so a backfill's memory stays at about one row
// group (~65,000 rows of sentence text) however long it runs.
const (
	parquetRowGroupRows = 1 << 16
	// settingsKey is the footer metadata entry naming what scored the
	// rows (runIdentity as JSON), in every Parquet file `score` writes.
	settingsKey = "scorer.settings"
)

func newParquetWriter(w io.Writer, settings string) *parquet.GenericWriter[parquetRow] {
	return parquet.NewGenericWriter[parquetRow](w,
		parquet.Compression(&parquet.Snappy),
		parquet.MaxRowsPerRowGroup(parquetRowGroupRows),
		parquet.CreatedBy("scorer", "", ""),
		parquet.KeyValueMetadata(settingsKey, settings))
}

// parquetSink writes one row per (call, section, sentence, label).
type parquetSink struct {
	w    *parquet.GenericWriter[parquetRow]
	buf  []parquetRow
	rows int64
}

func newParquetSink(w io.Writer, settings string) *parquetSink {
	return &parquetSink{w: newParquetWriter(w, settings)}
}

func (s *parquetSink) write(scored []schema.ScoredTranscript) error {
	for i := range scored {
		s.buf = s.buf[:0]
		for _, r := range schema.Rows(&scored[i]) {
			pr, err := parquetRowOf(&r)
			if err != nil {
				return err
			}
			s.buf = append(s.buf, pr)
		}
		if _, err := s.w.Write(s.buf); err != nil {
			return err
		}
		s.rows += int64(len(s.buf))
	}
	return nil
}

func (s *parquetSink) checkpoint() error { return nil }

func (s *parquetSink) finish() error { return s.w.Close() }
