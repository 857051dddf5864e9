package schema

import "sort"

// Rows flattens a ScoredTranscript into one ScoreRow per section × sentence ×
// label, for JDBC-style sinks that upsert on RowKey. The order is stable:
// sections by name, then sentence index, then labels in st.Labels order
// (labels present in results but not in st.Labels follow, sorted), so two
// calls on equal input give equal output.
//
// Sentence comes from SectionResult.Text, which the scorer fills in memory.
// A ScoredTranscript read back from the wire has no Text; then only flagged
// rows get their sentence (from LabelResult.Matches, in order) and the rest
// "". A score missing from Scores (a malformed result) yields Score 0 and
// Flag 0 rather than a panic.
func Rows(st *ScoredTranscript) []ScoreRow {
	if st == nil {
		return nil
	}
	names := make([]string, 0, len(st.Sections))
	for name := range st.Sections {
		names = append(names, name)
	}
	sort.Strings(names)

	n := 0
	for _, name := range names {
		n += st.Sections[name].Sentences * len(st.Sections[name].Results)
	}
	rows := make([]ScoreRow, 0, n)
	for _, name := range names {
		sec := st.Sections[name]
		labels := rowLabels(st.Labels, sec.Results)
		// matchText[label][i] = flagged sentence text for sentence i.
		texts := make([][]string, len(labels))
		for li, label := range labels {
			res := sec.Results[label]
			t := make([]string, sec.Sentences)
			if len(sec.Text) == sec.Sentences {
				copy(t, sec.Text)
				texts[li] = t
				continue
			}
			k := 0
			for i := 0; i < sec.Sentences && i < len(res.Flags); i++ {
				if res.Flags[i] == 1 && k < len(res.Matches) {
					t[i] = res.Matches[k]
					k++
				}
			}
			texts[li] = t
		}
		for i := 0; i < sec.Sentences; i++ {
			for li, label := range labels {
				res := sec.Results[label]
				row := ScoreRow{
					CallID: st.CallID, Section: name, SentenceIndex: i, Label: label,
					EntityID: st.EntityID, EventTime: st.EventTime, VersionID: st.VersionID,
					Sentence: texts[li][i], Threshold: st.Threshold,
					ModelSHA256: st.Model.SHA256, PairEncoding: st.PairEncoding, ScoredAt: st.ScoredAt,
				}
				if i < len(res.Scores) {
					row.Score = res.Scores[i]
				}
				if i < len(res.Flags) {
					row.Flag = res.Flags[i]
				}
				rows = append(rows, row)
			}
		}
	}
	return rows
}

// rowLabels returns the labels of results in declared order, then extras
// sorted; declared labels without a result are skipped.
func rowLabels(declared []string, results map[string]LabelResult) []string {
	out := make([]string, 0, len(results))
	seen := make(map[string]bool, len(results))
	for _, l := range declared {
		if _, ok := results[l]; ok && !seen[l] {
			out = append(out, l)
			seen[l] = true
		}
	}
	var extra []string
	for l := range results {
		if !seen[l] {
			extra = append(extra, l)
		}
	}
	sort.Strings(extra)
	return append(out, extra...)
}
