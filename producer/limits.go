package producer

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"

	"github.com/scorer/scorer/schema"
)

// OutputShape is what sizes an output record besides the transcript in it:
// the input limits every accepted transcript is within, and the settings
// every result of the process carries.
type OutputShape struct {
	// Limits are the input limits (schema.Limits; zero fields take the
	// defaults). A negative one, a check turned off, leaves the output
	// unbounded, and the Max*Bytes functions fail.
	Limits schema.Limits
	// Labels, Template and ScoreMode are LABELS, HYPOTHESIS_TEMPLATE and
	// SCORE_MODE.
	Labels    []string
	Template  string
	ScoreMode string
	// SourceTopic is the input topic, named in every result and header.
	SourceTopic string
}

// Worst cases of the encoding, which the bounds below rest on.
const (
	// maxModelName bounds a model's name, the base name of its folder.
	maxModelName = 255
	// textGrowth bounds how much longer a text is in an output value than
	// in the input record it came from: a byte that MarshalValue escapes
	// as \u00XX took at least 3 there (a JSON escape, or a Python escape
	// such as \1 inside a JSON string, whose backslash JSON doubles), and
	// U+2028 and U+2029, 3 bytes raw, become 6-byte escapes. Everything
	// else is copied as it is.
	textGrowth = 2
	// escapedByte is the longest form one byte of a string takes in JSON
	// (\u00XX), for text whose input form is not known (names of up to
	// MaxFieldBytes, a sentence of up to MaxSentenceBytes).
	escapedByte = 6
	// matchOverhead is what a match adds around its text: quotes and a
	// comma.
	matchOverhead = 3
	// maxErrorHeaders bounds the __connect.errors.* and scorer.dlq.*
	// headers of a dead letter (the message can list the call_ids of a
	// batch).
	maxErrorHeaders = 256 << 10
)

// worstScore is a score whose JSON form is as long as a float32 in [0, 1]
// gets (16 bytes: 0.0000012345679); TestWorstScoreIsLongest checks it.
var worstScore = float32(1.2345679e-06)

// worstText is n bytes whose JSON string form is as long as n bytes can
// get (every byte a six-byte \u00XX escape), distinct for each tag.
func worstText(n, tag int) string {
	// Control characters without a short escape (\b \t \n \f \r have one).
	const long = "\x01\x02\x03\x04\x05\x06\x07\x0b\x0e\x0f\x10\x11\x12\x13\x14\x15\x16\x17\x18\x19\x1a\x1b\x1c\x1d\x1e\x1f"
	b := []byte(strings.Repeat("\x01", n))
	for i := 0; i < n && tag > 0; i++ {
		b[i] = long[tag%len(long)]
		tag /= len(long)
	}
	return string(b)
}

// bounded returns lim with defaults filled, or an error when a check is off.
func bounded(lim schema.Limits) (schema.Limits, error) {
	lim = lim.Effective()
	if lim.MaxMessageBytes < 0 || lim.MaxSentences < 0 || lim.MaxSentenceBytes < 0 || lim.MaxFieldBytes < 0 || lim.MaxSections < 0 {
		return lim, errors.New("producer: output size: an input limit is off, so a result has no bound")
	}
	return lim, nil
}

// skeleton is a result as large as one can be without the text it takes
// from its input record: the most sections (named by short tags), each
// claiming the most sentences, every label's lists empty, the longest
// model name, timestamp and source, and the largest trace context passed
// on. The input's own text (identity fields, section names, matches) is
// bounded apart, against MAX_MESSAGE_BYTES.
func skeleton(s OutputShape, lim schema.Limits, sections int) schema.ScoredTranscript {
	st := schema.ScoredTranscript{
		// entity_event keys need both parts; worstKeyGrowth counts their
		// full length.
		EntityID: "e", EventTime: "t",
		Model:              schema.ModelInfo{Name: worstText(maxModelName, 7), SHA256: strings.Repeat("f", 64)},
		HypothesisTemplate: s.Template,
		ScoreMode:          s.ScoreMode,
		Threshold:          0.12345678901234568,
		Labels:             s.Labels,
		Sections:           make(map[string]schema.SectionResult, sections),
		ScoredAt:           "2006-01-02T15:04:05.999999999+07:00",
		Source: &schema.Source{Topic: s.SourceTopic, Partition: math.MinInt32, Offset: math.MinInt64, Generation: math.MinInt32,
			Trace: []schema.Header{
				{Key: schema.HeaderTraceParent, Value: make([]byte, schema.MaxTraceHeaderBytes)},
				{Key: schema.HeaderTraceState, Value: make([]byte, schema.MaxTraceHeaderBytes)},
			}},
	}
	for i := range sections {
		sec := schema.SectionResult{Sentences: lim.MaxSentences, Results: make(map[string]schema.LabelResult, len(s.Labels))}
		for _, l := range s.Labels {
			sec.Results[l] = schema.LabelResult{Scores: []float32{}, Flags: []int{}, Matches: []string{}}
		}
		st.Sections[strconv.Itoa(i)] = sec
	}
	return st
}

// withSentences gives every label of st's (single) section n sentences,
// each at the worst score, flagged, without matches.
func withSentences(st schema.ScoredTranscript, n int) schema.ScoredTranscript {
	for name, sec := range st.Sections {
		res := make(map[string]schema.LabelResult, len(sec.Results))
		for l := range sec.Results {
			lr := schema.LabelResult{Matches: []string{}}
			for range n {
				lr.Scores = append(lr.Scores, worstScore)
				lr.Flags = append(lr.Flags, 1)
			}
			res[l] = lr
		}
		sec.Results = res
		st.Sections[name] = sec
	}
	return st
}

// MaxResultBytes bounds the size (as the producer counts it against a
// topic's limit: key, value and headers) of the result of any transcript
// DecodeEvent accepts under s.Limits, in c's Format and Key. The structure
// is measured with the real encoder on a worst-case skeleton: the most
// sections, and per sentence and label a score and a flag. The text a
// result takes from its input record (identity fields, section names, and
// a sentence's text for each label that flags it: every sentence can match
// every label) is at most textGrowth times what it took there, and all of
// it is within MAX_MESSAGE_BYTES; a key can repeat identity fields. So the
// bound grows with labels × (2 × MAX_MESSAGE_BYTES + 3 × MAX_SENTENCES) and
// with labels × MAX_SENTENCES × a score's and a flag's size.
func (c Config) MaxResultBytes(s OutputShape) (int64, error) {
	if err := c.Validate(); err != nil {
		return 0, err
	}
	lim, err := bounded(s.Limits)
	if err != nil {
		return 0, err
	}
	p := &Producer{cfg: c}
	size := func(st schema.ScoredTranscript) (int64, error) {
		m, err := p.resultMessage(&st)
		if err != nil {
			return 0, fmt.Errorf("producer: output size: %w", err)
		}
		return recordSize(m), nil
	}
	fixed, err := size(skeleton(s, lim, lim.MaxSections))
	if err != nil {
		return 0, err
	}
	one, err := size(withSentences(skeleton(s, lim, 1), 1))
	if err != nil {
		return 0, err
	}
	two, err := size(withSentences(skeleton(s, lim, 1), 2))
	if err != nil {
		return 0, err
	}
	key, err := p.worstKeyGrowth(lim)
	if err != nil {
		return 0, err
	}
	labels := int64(max(len(s.Labels), 1))
	text := labels * (textGrowth*int64(lim.MaxMessageBytes) + matchOverhead*int64(lim.MaxSentences))
	return fixed + int64(lim.MaxSentences)*(two-one) + text + key, nil
}

// worstKeyGrowth is how much longer a result's key gets with identity
// fields at their limit in their longest encoding than with the
// skeleton's.
func (p *Producer) worstKeyGrowth(lim schema.Limits) (int64, error) {
	worst, err := p.resultKey(worstText(lim.MaxFieldBytes, 1), worstText(lim.MaxFieldBytes, 2), worstText(lim.MaxFieldBytes, 5))
	if err != nil {
		return 0, fmt.Errorf("producer: output size: %w", err)
	}
	least, err := p.resultKey("", "e", "t")
	if err != nil {
		return 0, fmt.Errorf("producer: output size: %w", err)
	}
	return int64(len(worst) - len(least)), nil
}

// MaxRowBytes bounds the size of any row (key, value and headers) of an
// accepted transcript, in c's Format and Key: a worst-case row measured
// with the real encoder, plus its sentence, at most MaxSentenceBytes in
// its longest escaping and textGrowth times the input record.
func (c Config) MaxRowBytes(s OutputShape) (int64, error) {
	if err := c.Validate(); err != nil {
		return 0, err
	}
	lim, err := bounded(s.Limits)
	if err != nil {
		return 0, err
	}
	label := ""
	for _, l := range s.Labels {
		if len(l) > len(label) {
			label = l
		}
	}
	st := skeleton(s, lim, 0)
	r := schema.ScoreRow{
		CallID: worstText(lim.MaxFieldBytes, 1), Section: worstText(lim.MaxFieldBytes, 8), SentenceIndex: math.MinInt32, Label: label,
		EntityID: worstText(lim.MaxFieldBytes, 2), EventTime: worstText(lim.MaxFieldBytes, 5), VersionID: worstText(lim.MaxFieldBytes, 6),
		Score: worstScore, Flag: 1, Threshold: st.Threshold, ModelSHA256: st.Model.SHA256, ScoredAt: st.ScoredAt,
	}
	m, err := (&Producer{cfg: c}).rowMessage(&r, st.Model.SHA256, st.Source)
	if err != nil {
		return 0, fmt.Errorf("producer: output size: %w", err)
	}
	sentence := min(escapedByte*int64(lim.MaxSentenceBytes), textGrowth*int64(lim.MaxMessageBytes))
	return recordSize(m) + sentence, nil
}

// MaxDeadLetterBytes bounds a full dead letter of an input record within
// maxInput bytes (MAX_MESSAGE_BYTES): its value, its key and original
// headers (what the consumer fetches beyond maxInput) and the error
// headers. A DLQ topic that fits it keeps every dead letter's value; with
// less, values over its limit are dropped (HeaderDLQValueDropped).
func MaxDeadLetterBytes(maxInput int) int64 {
	return int64(maxInput) + schema.FetchSlack + maxErrorHeaders
}

// SizeHint turns a byte count into a short human form for messages.
func SizeHint(n int64) string {
	switch {
	case n >= 10<<20:
		return strconv.FormatInt(n>>20, 10) + " MiB"
	case n >= 10<<10:
		return strconv.FormatInt(n>>10, 10) + " KiB"
	}
	return strconv.FormatInt(n, 10) + " bytes"
}
