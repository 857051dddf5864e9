package schema

import "time"

// sampleScored is a realistic ScoredTranscript used by golden, Connect and
// Rows tests: two sections, three labels, flagged and unflagged sentences.
func sampleScored() ScoredTranscript {
	labels := []string{"consumer strength", "consumer weakness", "reduced consumer's spending patterns"}
	return ScoredTranscript{
		CallID: "A-2020-Q4", EntityID: "A", CompanyName: "Agilent Technologies, Inc.",
		CallName: "Q4 2020 Earnings Call", EventTime: "2020-11-23T21:30:00Z", VersionID: "3",
		Model:              ModelInfo{Name: "nli-unigram-small", SHA256: "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"},
		HypothesisTemplate: "This text is about {}.",
		ScoreMode:          "softmax",
		PairEncoding:       "joined",
		PairSeparator:      "</s></s>",
		Threshold:          0.91,
		Labels:             labels,
		Sections: map[string]SectionResult{
			"FILT_MD": {Sentences: 2, Results: map[string]LabelResult{
				labels[0]: {Scores: []float32{0.95, 0.125}, Flags: []int{1, 0}, Matches: []string{"Consumers kept spending."}},
				labels[1]: {Scores: []float32{0.01, 0.5}, Flags: []int{0, 0}, Matches: []string{}},
				labels[2]: {Scores: []float32{0.25, 0.99}, Flags: []int{0, 1}, Matches: []string{"Shoppers cut back."}},
			}},
			"FILT_QA": {Sentences: 1, Results: map[string]LabelResult{
				labels[0]: {Scores: []float32{0.5}, Flags: []int{0}, Matches: []string{}},
				labels[1]: {Scores: []float32{0.92}, Flags: []int{1}, Matches: []string{"Is demand weak?"}},
				labels[2]: {Scores: []float32{0}, Flags: []int{0}, Matches: []string{}},
			}},
		},
		ScoredAt: time.Date(2024, 5, 1, 12, 0, 0, 0, time.UTC).Format(time.RFC3339Nano),
		Source:   &Source{Topic: "transcripts", Partition: 2, Offset: 41, Generation: 7},
	}
}

func sampleDeadLetter() DeadLetter {
	return DeadLetter{
		Key: []byte("A-2020-Q4"), Value: []byte(`{"call_id":`),
		Headers:   []Header{{Key: "trace-id", Value: []byte("abc")}},
		Timestamp: time.Date(2024, 5, 1, 11, 59, 0, 0, time.UTC),
		Topic:     "transcripts", Partition: 2, Offset: 42,
		Stage: StageDecode, Reason: ReasonMalformedJSON.String(),
		ExceptionClass: "schema.DecodeError", Message: "schema: invalid event: malformed_json: unexpected end of JSON input",
	}
}
