package schema

import "sort"

// TranscriptEvent is one earnings-call transcript to score. Sections maps a
// section name (FILT_MD, FILT_QA, or any other the producer sends) to its
// sentences in order. Values come out of DecodeEvent already validated.
type TranscriptEvent struct {
	CallID      string              `json:"call_id"`
	EntityID    string              `json:"entity_id,omitempty"`
	CompanyName string              `json:"company_name,omitempty"`
	CallName    string              `json:"call_name,omitempty"`
	EventTime   string              `json:"event_time,omitempty"`
	VersionID   string              `json:"version_id,omitempty"`
	Sections    map[string][]string `json:"sections"`
}

// SectionNames returns the event's section names sorted, so that every
// consumer of an event walks its sections in the same order.
func (e *TranscriptEvent) SectionNames() []string {
	names := make([]string, 0, len(e.Sections))
	for name := range e.Sections {
		names = append(names, name)
	}
	sort.Strings(names)
	return names
}

// SentenceCount is the number of sentences over all sections.
func (e *TranscriptEvent) SentenceCount() int {
	n := 0
	for _, s := range e.Sections {
		n += len(s)
	}
	return n
}

// ModelInfo identifies the model that produced a score. SHA256 is the hash of
// the ONNX file and is the model's version: two records with the same SHA256
// were scored by the same weights.
type ModelInfo struct {
	Name   string `json:"name"`
	SHA256 string `json:"sha256"`
}

// LabelResult holds one label's outcome over one section: a score per
// sentence in sentence order, a 0/1 flag per sentence (score > threshold) and
// the flagged sentences themselves, in order.
type LabelResult struct {
	Scores  []float32 `json:"scores"`
	Flags   []int     `json:"flags"`
	Matches []string  `json:"matches"`
}

// SectionResult is one section's outcome: its sentence count and a
// LabelResult per label.
type SectionResult struct {
	Sentences int                    `json:"sentences"`
	Results   map[string]LabelResult `json:"results"`
	// Text is the section's sentences, carried in memory from the scorer to
	// the producer so that flat rows can hold every sentence's text. It is
	// not part of the ScoredTranscript wire shape: the input already has it.
	Text []string `json:"-"`
}

// Source says which input record a result came from, so that a consumer of
// the output topic can trace and deduplicate at-least-once redeliveries.
//
// Generation is the consumer-group generation whose member wrote it: a
// write from an older generation than the sink has already seen for that
// input partition is work the scorer abandoned at a rebalance (see
// docs/reliability.md, "Dropping stale writes").
type Source struct {
	Topic      string `json:"topic"`
	Partition  int    `json:"partition"`
	Offset     int64  `json:"offset"`
	Generation int32  `json:"generation"`
	// Trace is the input record's trace context (TraceContext), which
	// the result's and its rows' records carry as headers. It is not part
	// of the value: it belongs to the record, as on the input.
	Trace []Header `json:"-"`
}

// ScoredTranscript is the output record for one TranscriptEvent: the event's
// identity, what scored it and how, and per-section, per-label results.
// What scored it is the model (its ONNX SHA-256), the hypothesis template,
// the score mode and the pair encoding: "pair" ([CLS] premise [SEP]
// hypothesis [SEP]) or "joined" (premise + PairSeparator + hypothesis as one
// sequence, the Spark job's encoding); records that differ in any of them
// are not comparable score for score.
type ScoredTranscript struct {
	CallID             string                   `json:"call_id"`
	EntityID           string                   `json:"entity_id,omitempty"`
	CompanyName        string                   `json:"company_name,omitempty"`
	CallName           string                   `json:"call_name,omitempty"`
	EventTime          string                   `json:"event_time,omitempty"`
	VersionID          string                   `json:"version_id,omitempty"`
	Model              ModelInfo                `json:"model"`
	HypothesisTemplate string                   `json:"hypothesis_template"`
	ScoreMode          string                   `json:"score_mode"`
	PairEncoding       string                   `json:"pair_encoding"`
	PairSeparator      string                   `json:"pair_separator,omitempty"`
	Threshold          float64                  `json:"threshold"`
	Labels             []string                 `json:"labels"`
	Sections           map[string]SectionResult `json:"sections"`
	ScoredAt           string                   `json:"scored_at"`
	Source             *Source                  `json:"source,omitempty"`
}

// ScoreRow is the flat form of one (call_id, section, sentence_index, label)
// result: the shape a JDBC sink upserts, keyed by RowKey.
type ScoreRow struct {
	CallID        string  `json:"call_id"`
	Section       string  `json:"section"`
	SentenceIndex int     `json:"sentence_index"`
	Label         string  `json:"label"`
	EntityID      string  `json:"entity_id,omitempty"`
	EventTime     string  `json:"event_time,omitempty"`
	VersionID     string  `json:"version_id,omitempty"`
	Sentence      string  `json:"sentence"`
	Score         float32 `json:"score"`
	Flag          int     `json:"flag"`
	Threshold     float64 `json:"threshold"`
	ModelSHA256   string  `json:"model_sha256"`
	PairEncoding  string  `json:"pair_encoding"`
	ScoredAt      string  `json:"scored_at"`
}

// RowKey is the primary key of a ScoreRow: a redelivered transcript
// overwrites its rows instead of adding new ones.
type RowKey struct {
	CallID        string `json:"call_id"`
	Section       string `json:"section"`
	SentenceIndex int    `json:"sentence_index"`
	Label         string `json:"label"`
}

// Key returns the row's primary key.
func (r *ScoreRow) Key() RowKey {
	return RowKey{CallID: r.CallID, Section: r.Section, SentenceIndex: r.SentenceIndex, Label: r.Label}
}
