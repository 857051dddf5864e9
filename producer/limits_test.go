package producer

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/scorer/scorer/schema"
)

// TestWorstScoreIsLongest: no score in [0, 1] encodes longer than
// worstScore, which the result bound counts for every sentence.
func TestWorstScoreIsLongest(t *testing.T) {
	enc := func(f float32) int {
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		return len(b)
	}
	longest := enc(worstScore)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range 2_000_000 {
		f := r.Float32()
		if i%4 == 0 {
			f /= 1e5 // the 0.00000… range, where the form is longest
		}
		if n := enc(f); n > longest {
			t.Fatalf("score %v encodes in %d bytes, worstScore (%v) in %d", f, n, worstScore, longest)
		}
	}
	for _, f := range []float32{0, 1, 1e-45, 1e-38, 9.999999e-07, 1e-06, 1.1754944e-38} {
		if n := enc(f); n > longest {
			t.Errorf("score %v encodes in %d bytes, worstScore in %d", f, n, longest)
		}
	}
}

// scoreAll is what the scorer makes of ev at its largest: every sentence
// flagged for every label, at the longest score.
func scoreAll(ev schema.TranscriptEvent, labels []string) schema.ScoredTranscript {
	st := schema.ScoredTranscript{
		CallID: ev.CallID, EntityID: ev.EntityID, CompanyName: ev.CompanyName, CallName: ev.CallName,
		EventTime: ev.EventTime, VersionID: ev.VersionID,
		Model:              schema.ModelInfo{Name: "nli-unigram-small", SHA256: strings.Repeat("a", 64)},
		HypothesisTemplate: "This text is about {}.", ScoreMode: "softmax", Threshold: 0.91, Labels: labels,
		Sections: map[string]schema.SectionResult{}, ScoredAt: "2024-05-01T12:00:00.123456789Z",
		Source: &schema.Source{Topic: "transcripts", Partition: 5, Offset: 123456789, Generation: 42},
	}
	for name, sents := range ev.Sections {
		sec := schema.SectionResult{Sentences: len(sents), Results: map[string]schema.LabelResult{}, Text: sents}
		for _, l := range labels {
			lr := schema.LabelResult{Scores: make([]float32, len(sents)), Flags: make([]int, len(sents)), Matches: append([]string{}, sents...)}
			for i := range sents {
				lr.Scores[i], lr.Flags[i] = worstScore, 1
			}
			sec.Results[l] = lr
		}
		st.Sections[name] = sec
	}
	return st
}

// TestMaxResultBytesHolds: records built to be as large as the input limits
// allow (text that escapes longer than it came in, the most sentences, the
// most sections, identity fields at their limit), every sentence flagged
// for every label, encode within MaxResultBytes, and their rows within
// MaxRowBytes, in every format and key mode. The largest come within a few
// per cent of the bound: it is not loose either.
func TestMaxResultBytesHolds(t *testing.T) {
	lim := schema.Limits{MaxMessageBytes: 48 << 10, MaxSentences: 400, MaxSentenceBytes: 8 << 10, MaxFieldBytes: 64, MaxSections: 8}
	labels := []string{"consumer strength", "consumer weakness", "reduced consumer's spending patterns"}
	jsonStr := func(s string) string {
		b, _ := json.Marshal(s)
		return string(b)
	}
	// fill makes a record of one field-sized identity and sections filled
	// by one sentence pattern up to the limits.
	fill := func(sentence string, sections, perSection int) string {
		ctrl := strings.Repeat(`\u0001`, lim.MaxFieldBytes)
		var b strings.Builder
		fmt.Fprintf(&b, `{"call_id":"%s","entity_id":"%s","company_name":"%s","call_name":"%s","event_time":"%s","version_id":"%s","sections":{`,
			ctrl, ctrl, ctrl, ctrl, ctrl, ctrl)
		for i := range sections {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"%s%d":[`, strings.Repeat(`\u0002`, lim.MaxFieldBytes-1), i)
			for j := range perSection {
				if j > 0 {
					b.WriteByte(',')
				}
				b.WriteString(sentence)
			}
			b.WriteString(`]`)
		}
		b.WriteString(`}}`)
		return b.String()
	}
	// largest returns the largest record make(n) that DecodeEvent accepts.
	largest := func(make func(n int) string) string {
		ok := func(n int) bool {
			in := make(n)
			_, err := schema.DecodeEvent([]byte(in), lim)
			return len(in) <= lim.MaxMessageBytes && err == nil
		}
		lo, hi := 1, 1
		for ok(hi) {
			lo, hi = hi, hi*2
		}
		for lo+1 < hi { // ok(lo), !ok(hi)
			if mid := (lo + hi) / 2; ok(mid) {
				lo = mid
			} else {
				hi = mid
			}
		}
		return make(lo)
	}
	// grow makes the largest record of sentences that repeat unit (raw
	// JSON string content) up to MaxSentenceBytes each.
	grow := func(unit string, decoded int) string {
		// The identity fields and section names take about 3 KiB.
		sentence := `"` + strings.Repeat(unit, min(lim.MaxSentenceBytes/decoded, (lim.MaxMessageBytes-4096)/len(unit))) + `"`
		return largest(func(n int) string { return fill(sentence, 1, n) })
	}
	python := func(unit string) string {
		return largest(func(n int) string {
			lit := "[" + strings.TrimSuffix(strings.Repeat("'"+unit+"', ", n), ", ") + "]"
			return `{"CALL_ID":"x","ENTITY_ID":"e","EVENT_DATETIME_UTC":"t","FILT_MD":` + jsonStr(lit) + `}`
		})
	}
	inputs := map[string]string{
		"line separators, raw":   grow("\u2028", 3),
		"html characters":        grow("<>&", 3),
		"control escapes":        grow(`\u0001`, 1),
		"most empty sentences":   fill(`""`, 8, 50),
		"most short sentences":   fill(`"\u2028"`, 8, 50),
		"python octal escapes":   python(strings.Repeat(`\1`, 1000)),
		"python empty sentences": python(""),
	}
	for _, format := range []string{FormatJSON, FormatConnect} {
		for _, key := range []string{KeyCallID, KeyEntityEvent} {
			c := Config{Brokers: []string{"b"}, Topic: "transcripts.scored", RowsTopic: "rows", DLQTopic: "dlq", Format: format, Key: key}
			shape := OutputShape{Limits: lim, Labels: labels, Template: "This text is about {}.", ScoreMode: "softmax", SourceTopic: "transcripts"}
			bound, err := c.MaxResultBytes(shape)
			if err != nil {
				t.Fatal(err)
			}
			rowBound, err := c.MaxRowBytes(shape)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Validate(); err != nil {
				t.Fatal(err)
			}
			p := &Producer{cfg: c}
			largest := 0.0
			for name, in := range inputs {
				if len(in) > lim.MaxMessageBytes {
					t.Fatalf("%s: input is %d bytes, over the limit %d", name, len(in), lim.MaxMessageBytes)
				}
				ev, err := schema.DecodeEvent([]byte(in), lim)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if key == KeyEntityEvent && (ev.EntityID == "" || ev.EventTime == "") {
					continue
				}
				st := scoreAll(ev, labels)
				m, err := p.resultMessage(&st)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				n := recordSize(m)
				if n > bound {
					t.Errorf("%s/%s, %s: result is %d bytes, over MaxResultBytes %d", format, key, name, n, bound)
				}
				largest = max(largest, float64(n)/float64(bound))
				for _, r := range schema.Rows(&st) {
					rm, err := p.rowMessage(&r, st.Model.SHA256, st.Source)
					if err != nil {
						t.Fatalf("%s: row: %v", name, err)
					}
					if rn := recordSize(rm); rn > rowBound {
						t.Errorf("%s/%s, %s: row is %d bytes, over MaxRowBytes %d", format, key, name, rn, rowBound)
						break
					}
				}
			}
			t.Logf("%s/%s: bound %d bytes; the largest result reaches %.0f%% of it", format, key, bound, 100*largest)
			if largest < 0.8 {
				t.Errorf("%s/%s: the largest result is %.0f%% of the bound; want the bound within 25%% of the worst case", format, key, 100*largest)
			}
		}
	}
}

// TestTopicBytesRoundTrip: a topic sized by TopicBytes for n-byte records
// accepts n-byte records (RecordLimit), with and without compression.
func TestTopicBytesRoundTrip(t *testing.T) {
	for _, comp := range []string{"none", "snappy", "zstd"} {
		c := Config{Compression: comp}
		for _, n := range []int64{1, 1000, 1 << 20, 56_652_952, 123_456_789} {
			if got := c.RecordLimit(c.TopicBytes(n)); got < n {
				t.Errorf("%s: RecordLimit(TopicBytes(%d)) = %d", comp, n, got)
			}
			if top := c.TopicBytes(n); c.TopicBytes(c.RecordLimit(top)) > top {
				t.Errorf("%s: TopicBytes(RecordLimit(%d)) = %d, over it", comp, top, c.TopicBytes(c.RecordLimit(top)))
			}
		}
	}
}

// TestTopicMaxBytesSizesRecords: records are held to their own topic's
// limit, not to BatchBytes: a 3 MB result and a dead letter with a 3 MB
// value are written to topics that allow them, a result over its topic's
// limit is reported permanent, and a dead letter over the DLQ's limit
// loses only its value.
func TestTopicMaxBytesSizesRecords(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	cfg := testConfig(c)
	cfg.RowsTopic = ""
	limits, err := PrepareTopics(ctx, c.ListenAddrs(), nil, true,
		TopicSpec{Name: "big.out", Configs: map[string]string{"max.message.bytes": strconv.FormatInt(cfg.TopicBytes(4<<20), 10)}},
		TopicSpec{Name: "big.dlq", Configs: map[string]string{"max.message.bytes": strconv.FormatInt(cfg.TopicBytes(4<<20), 10)}})
	if err != nil {
		t.Fatal(err)
	}
	cfg.Topic, cfg.DLQTopic, cfg.TopicMaxBytes = "big.out", "big.dlq", limits
	p := newProducer(t, cfg)

	withMatches := func(id string, n int) schema.ScoredTranscript {
		st := sample(id)
		lr := st.Sections["FILT_MD"].Results["x"]
		lr.Matches = []string{strings.Repeat("m", n)}
		st.Sections["FILT_MD"].Results["x"] = lr
		return st
	}
	if err := p.Publish(ctx, []schema.ScoredTranscript{withMatches("three-mb", 3<<20)}); err != nil {
		t.Fatalf("a 3 MB result for a topic that allows 4 MiB records: %v", err)
	}
	var perm *PermanentError
	if err := p.Publish(ctx, []schema.ScoredTranscript{withMatches("five-mb", 5<<20)}); !errors.As(err, &perm) || perm.CallIDs[0] != "five-mb" {
		t.Errorf("a 5 MB result for a topic that allows 4 MiB: %v, want a *PermanentError naming it", err)
	}
	if got := readAll(t, c, "big.out", 1); len(got) != 1 || len(got[0].Value) < 3<<20 {
		t.Fatalf("big.out holds %d records, want the 3 MB result", len(got))
	}

	dl := func(key string, n int) schema.DeadLetter {
		return schema.DeadLetter{Key: []byte(key), Value: bytes.Repeat([]byte("v"), n), Timestamp: time.Now(),
			Topic: "transcripts", Offset: int64(n), Stage: schema.StageDecode, Reason: "malformed_json", Message: "bad"}
	}
	dls := []schema.DeadLetter{dl("three-mb", 3<<20), dl("five-mb", 5<<20)}
	if err := p.DeadLetter(ctx, dls); err != nil {
		t.Fatal(err)
	}
	got := readAll(t, c, "big.dlq", 2)
	if len(got) != 2 {
		t.Fatalf("big.dlq holds %d records, want 2", len(got))
	}
	for _, r := range got {
		dropped, isDropped := header(r, HeaderDLQValueDropped)
		switch r.Value == nil {
		case false:
			if len(r.Value) != 3<<20 || isDropped {
				t.Errorf("dead letter with a %d-byte value (dropped header %q), want the 3 MB one kept whole", len(r.Value), dropped)
			}
		case true:
			if dropped != strconv.Itoa(5<<20) {
				t.Errorf("dead letter without value: dropped header %q, want %d", dropped, 5<<20)
			}
		}
	}
}
