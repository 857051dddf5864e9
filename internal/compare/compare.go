// Package compare scores one transcript sample with two models (or two
// ONNX files of one model, one model on two devices, or one model under
// two pair encodings) and measures how
// far apart they are: |Δp| quantiles, decision agreement at the threshold
// per label, the sentences whose decision flips, and each side's
// throughput. It is the gate before switching to an int8 export, rolling
// out a new model version, or trusting a GPU against the CPU.
package compare

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"

	"github.com/scorer/scorer/internal/measure"
	"github.com/scorer/scorer/schema"
)

// TranscriptScorer scores whole transcripts; fanout.TranscriptScorer
// implements it.
type TranscriptScorer interface {
	Score(ctx context.Context, events []schema.TranscriptEvent) ([]schema.ScoredTranscript, error)
}

// Run is one side's scores of the sample and how long they took.
type Run struct {
	// Name says which side this is (model folder, ONNX file, device).
	Name    string
	Results []schema.ScoredTranscript
	// Pairs is sentences × labels scored.
	Pairs int
	// Seconds is the wall time of scoring, tokenizing included.
	Seconds float64
	// GraphRewrite is what loading changed in the side's graph
	// (model.Model.GraphRewrite): REL_ATTENTION_REWRITE's A/B names its
	// sides by it.
	GraphRewrite string
}

// ScoreTranscripts runs events through s chunk transcripts at a time, as
// `scorer score` does, and times it.
func ScoreTranscripts(ctx context.Context, name string, s TranscriptScorer, events []schema.TranscriptEvent, chunk int) (Run, error) {
	if chunk <= 0 {
		return Run{}, fmt.Errorf("compare: chunk %d must be > 0", chunk)
	}
	run, err := measure.Chunks(ctx, events, measure.Every(chunk), s.Score)
	if err != nil {
		return Run{}, fmt.Errorf("compare: %s: %w", name, err)
	}
	r := Run{Name: name, Results: run.Results, Seconds: run.Wall.Seconds()}
	for _, st := range r.Results {
		for _, sec := range st.Sections {
			r.Pairs += sec.Sentences * len(st.Labels)
		}
	}
	return r, nil
}

// ReadEvents decodes a TranscriptEvent JSONL sample, at most limit
// transcripts (0 = all). A bad line is an error: a comparison over a
// silently shortened sample would mislead.
func ReadEvents(r io.Reader, lim schema.Limits, limit int) ([]schema.TranscriptEvent, error) {
	var out []schema.TranscriptEvent
	err := schema.ReadEvents(r, lim, max(lim.MaxMessageBytes, 1<<20), func(ev schema.TranscriptEvent, _ []byte) bool {
		out = append(out, ev)
		return limit <= 0 || len(out) < limit
	})
	if err != nil {
		return nil, fmt.Errorf("compare: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("compare: the input holds no transcripts")
	}
	return out, nil
}

// Options set the decision threshold and the gate.
type Options struct {
	// Threshold decides a pair as a match when its score is above it,
	// as the scorer's THRESHOLD does.
	Threshold float64
	// MinAgreement is the smallest share of pairs, per label, whose
	// decision must agree for the comparison to pass (0 to 1).
	MinAgreement float64
	// Flips is how many flipped sentences the report lists, largest |Δp|
	// first.
	Flips int
}

// Side is one side's identity and speed in a Report. PairEncoding (and
// PairSeparator, when joined) is how the side encoded its pairs, read from
// its records: part of what the side is, like its model.
type Side struct {
	Name          string  `json:"name"`
	PairEncoding  string  `json:"pair_encoding"`
	PairSeparator string  `json:"pair_separator,omitempty"`
	GraphRewrite  string  `json:"graph_rewrite,omitempty"`
	Seconds       float64 `json:"seconds"`
	PairsPerSec   float64 `json:"pairs_per_sec"`
}

// LabelAgreement is decision agreement for one label.
type LabelAgreement struct {
	Label     string  `json:"label"`
	Pairs     int     `json:"pairs"`
	Agree     int     `json:"agree"`
	Agreement float64 `json:"agreement"`
	// OnlyA and OnlyB count pairs flagged by one side only.
	OnlyA int `json:"only_a"`
	OnlyB int `json:"only_b"`
}

// Flip is a pair whose decision differs between the sides.
type Flip struct {
	CallID   string  `json:"call_id"`
	Section  string  `json:"section"`
	Sentence int     `json:"sentence_index"`
	Label    string  `json:"label"`
	Text     string  `json:"text"`
	A        float32 `json:"a"`
	B        float32 `json:"b"`
}

// Report is the comparison's result; --json prints it as is.
type Report struct {
	A            Side             `json:"a"`
	B            Side             `json:"b"`
	Transcripts  int              `json:"transcripts"`
	Pairs        int              `json:"pairs"`
	Threshold    float64          `json:"threshold"`
	MaxAbsDiff   float64          `json:"max_abs_diff"`
	P50AbsDiff   float64          `json:"p50_abs_diff"`
	P99AbsDiff   float64          `json:"p99_abs_diff"`
	MeanAbsDiff  float64          `json:"mean_abs_diff"`
	Agreement    float64          `json:"agreement"`
	Labels       []LabelAgreement `json:"labels"`
	FlipCount    int              `json:"flips"`
	Flips        []Flip           `json:"flipped"`
	MinAgreement float64          `json:"min_agreement"`
	// Pass is true when every label's agreement is at least MinAgreement.
	Pass bool `json:"pass"`
}

// maxFlipText keeps a flipped sentence to one readable line.
const maxFlipText = 120

// Compare lines up a and b pair by pair. Both must have scored the same
// transcripts with the same labels, in the same order.
func Compare(a, b Run, opts Options) (Report, error) {
	if math.IsNaN(opts.Threshold) || opts.Threshold < 0 || opts.Threshold > 1 {
		return Report{}, fmt.Errorf("compare: threshold %v is outside [0, 1]", opts.Threshold)
	}
	if math.IsNaN(opts.MinAgreement) || opts.MinAgreement < 0 || opts.MinAgreement > 1 {
		return Report{}, fmt.Errorf("compare: min agreement %v is outside [0, 1]", opts.MinAgreement)
	}
	if len(a.Results) != len(b.Results) {
		return Report{}, fmt.Errorf("compare: %s scored %d transcripts, %s %d", a.Name, len(a.Results), b.Name, len(b.Results))
	}
	rep := Report{A: side(a), B: side(b), Transcripts: len(a.Results), Threshold: opts.Threshold, MinAgreement: opts.MinAgreement}
	all := measure.Tally{Threshold: opts.Threshold, KeepDiffs: true}
	byLabel := map[string]*measure.Tally{}
	var labels []string // in the order first met
	var flips []Flip
	for i := range a.Results {
		ra, rb := &a.Results[i], &b.Results[i]
		if ra.CallID != rb.CallID {
			return Report{}, fmt.Errorf("compare: transcript %d is %q on one side and %q on the other", i, ra.CallID, rb.CallID)
		}
		if !slices.Equal(ra.Labels, rb.Labels) {
			return Report{}, fmt.Errorf("compare: %s has labels %q on one side and %q on the other", ra.CallID, ra.Labels, rb.Labels)
		}
		secs := make([]string, 0, len(ra.Sections))
		for name := range ra.Sections {
			secs = append(secs, name)
		}
		slices.Sort(secs)
		if len(rb.Sections) != len(secs) {
			return Report{}, fmt.Errorf("compare: %s has %d sections on one side and %d on the other", ra.CallID, len(secs), len(rb.Sections))
		}
		for _, name := range secs {
			sa, sb := ra.Sections[name], rb.Sections[name]
			if sa.Sentences != sb.Sentences {
				return Report{}, fmt.Errorf("compare: %s section %q has %d sentences on one side and %d on the other", ra.CallID, name, sa.Sentences, sb.Sentences)
			}
			for _, label := range ra.Labels {
				la, lb := sa.Results[label].Scores, sb.Results[label].Scores
				if len(la) != sa.Sentences || len(lb) != sa.Sentences {
					return Report{}, fmt.Errorf("compare: %s section %q label %q: %d and %d scores for %d sentences", ra.CallID, name, label, len(la), len(lb), sa.Sentences)
				}
				lt := byLabel[label]
				if lt == nil {
					lt = &measure.Tally{Threshold: opts.Threshold}
					byLabel[label] = lt
					labels = append(labels, label)
				}
				for j := range la {
					all.Add(la[j], lb[j])
					if lt.Add(la[j], lb[j]) {
						text := ""
						if j < len(sa.Text) {
							text = truncate(sa.Text[j], maxFlipText)
						}
						flips = append(flips, Flip{CallID: ra.CallID, Section: name, Sentence: j, Label: label, Text: text, A: la[j], B: lb[j]})
					}
				}
			}
		}
	}
	if all.Pairs == 0 {
		return Report{}, errors.New("compare: the sample has no sentences to compare")
	}
	rep.Pairs = all.Pairs
	diffs := all.Diffs
	slices.Sort(diffs)
	rep.MaxAbsDiff = diffs[len(diffs)-1]
	rep.P50AbsDiff = measure.Quantile(diffs, 0.50)
	rep.P99AbsDiff = measure.Quantile(diffs, 0.99)
	rep.MeanAbsDiff = all.SumAbsDiff / float64(all.Pairs)
	rep.Agreement = all.Agreement()
	rep.Pass = true
	for _, label := range labels {
		lt := byLabel[label]
		ag := LabelAgreement{Label: label, Pairs: lt.Pairs, Agree: lt.Agree, Agreement: lt.Agreement(), OnlyA: lt.OnlyA, OnlyB: lt.OnlyB}
		rep.Labels = append(rep.Labels, ag)
		if ag.Agreement < opts.MinAgreement {
			rep.Pass = false
		}
	}
	rep.FlipCount = len(flips)
	slices.SortStableFunc(flips, func(x, y Flip) int {
		return cmp.Compare(math.Abs(float64(y.A-y.B)), math.Abs(float64(x.A-x.B)))
	})
	rep.Flips = flips[:min(len(flips), max(opts.Flips, 0))]
	return rep, nil
}

func side(r Run) Side {
	s := Side{Name: r.Name, Seconds: r.Seconds, GraphRewrite: r.GraphRewrite}
	if len(r.Results) > 0 {
		s.PairEncoding, s.PairSeparator = r.Results[0].PairEncoding, r.Results[0].PairSeparator
	}
	if r.Seconds > 0 {
		s.PairsPerSec = float64(r.Pairs) / r.Seconds
	}
	return s
}

// truncate cuts s to at most n runes, marking the cut.
func truncate(s string, n int) string {
	r := []rune(s)
	if len(r) <= n {
		return s
	}
	return string(r[:n-1]) + "…"
}

// WriteText prints the report for a person.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "A: %s\nB: %s\n", r.A.Name, r.B.Name)
	if r.A.GraphRewrite != r.B.GraphRewrite {
		fmt.Fprintf(&b, "A's graph: %s\nB's graph: %s\n", r.A.GraphRewrite, r.B.GraphRewrite)
	}
	fmt.Fprintf(&b, "transcripts %d, pairs %d\n", r.Transcripts, r.Pairs)
	fmt.Fprintf(&b, "|Δp|: max %.6f  p99 %.6f  p50 %.6f  mean %.6f\n", r.MaxAbsDiff, r.P99AbsDiff, r.P50AbsDiff, r.MeanAbsDiff)
	fmt.Fprintf(&b, "decision agreement at threshold %g: %.4f%% overall (%d flips)\n", r.Threshold, 100*r.Agreement, r.FlipCount)
	for _, l := range r.Labels {
		fmt.Fprintf(&b, "  %-40s %.4f%%  (%d of %d; flagged by A only %d, by B only %d)\n",
			l.Label, 100*l.Agreement, l.Agree, l.Pairs, l.OnlyA, l.OnlyB)
	}
	fmt.Fprintf(&b, "throughput: A %.1f pairs/s (%.1fs), B %.1f pairs/s (%.1fs)", r.A.PairsPerSec, r.A.Seconds, r.B.PairsPerSec, r.B.Seconds)
	if r.A.PairsPerSec > 0 {
		fmt.Fprintf(&b, ", B/A %.2f×", r.B.PairsPerSec/r.A.PairsPerSec)
	}
	b.WriteString("\n")
	if len(r.Flips) > 0 {
		fmt.Fprintf(&b, "flipped (largest |Δp| first, %d of %d):\n", len(r.Flips), r.FlipCount)
		for _, f := range r.Flips {
			fmt.Fprintf(&b, "  %s %s[%d] %q: A %.4f B %.4f  %q\n", f.CallID, f.Section, f.Sentence, f.Label, f.A, f.B, f.Text)
		}
	}
	verdict := "PASS"
	if !r.Pass {
		verdict = "FAIL"
	}
	fmt.Fprintf(&b, "%s: every label's agreement ≥ %.4f%%? %v\n", verdict, 100*r.MinAgreement, r.Pass)
	_, err := io.WriteString(w, b.String())
	return err
}
