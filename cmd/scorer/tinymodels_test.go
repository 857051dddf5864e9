package main

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/scorer/scorer/internal/broker"
	"github.com/scorer/scorer/internal/fanout"
	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/schema"
)

// The byte-level BPE families (issue 47): tools/tiny-models made a RoBERTa
// and a BART classifier with random weights and kept, in torch-logits.json,
// the logits of the torch module each graph was exported from, for real
// transcript sentences x the default hypotheses with ids from Hugging Face's
// tokenizers. These tests hold the whole scorer to them: its tokenizer, its
// batching (sentences of different lengths and </s> counts share batches)
// and the graph, through `scorer score` and `scorer run`.
var tinyBPEModels = []string{"nli-roberta-bpe-tiny", "nli-bart-bpe-tiny"}

// tinyThreshold flags about a quarter of the reference pairs; no reference
// score lies within tinyTolerance of it, so a decision cannot flip on
// float noise.
const (
	tinyThreshold = 0.5
	tinyTolerance = 1e-4
)

type tinyReference struct {
	Labels             []string                        `json:"labels"`
	HypothesisTemplate string                          `json:"hypothesis_template"`
	PairSeparator      string                          `json:"pair_separator"`
	ID2Label           map[string]string               `json:"id2label"`
	Sentences          []string                        `json:"sentences"`
	Logits             map[string][][][]float64        `json:"logits"`
	IDs                map[string][][][]int            `json:"ids"`
	scores             map[string]map[string][]float64 // encoding -> label -> score per sentence
}

// loadTinyReference reads torch-logits.json and turns each logits row into
// the score the scorer reports under its defaults: softmax, P(entailment).
func loadTinyReference(t *testing.T, dir string) *tinyReference {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(dir, "torch-logits.json"))
	if err != nil {
		t.Fatal(err)
	}
	var ref tinyReference
	if err := json.Unmarshal(data, &ref); err != nil {
		t.Fatal(err)
	}
	lc := fanout.DefaultLabelConfig()
	if strings.Join(ref.Labels, "|") != strings.Join(lc.Labels, "|") || ref.HypothesisTemplate != lc.Template {
		t.Fatalf("reference labels %q / %q are not the scorer's defaults %q / %q", ref.Labels, ref.HypothesisTemplate, lc.Labels, lc.Template)
	}
	entail := -1
	for k, v := range ref.ID2Label {
		if strings.HasPrefix(strings.ToLower(v), "entail") {
			fmt.Sscan(k, &entail)
		}
	}
	if entail < 0 {
		t.Fatalf("no entailment label in %v", ref.ID2Label)
	}
	ref.scores = map[string]map[string][]float64{}
	for enc, perSentence := range ref.Logits {
		ref.scores[enc] = map[string][]float64{}
		for _, rows := range perSentence {
			for h, row := range rows {
				m := math.Inf(-1)
				for _, v := range row {
					m = math.Max(m, v)
				}
				var sum float64
				for _, v := range row {
					sum += math.Exp(v - m)
				}
				p := math.Exp(row[entail]-m) / sum
				if math.Abs(p-tinyThreshold) <= tinyTolerance {
					t.Fatalf("reference score %v is within %v of the threshold: pick another", p, tinyTolerance)
				}
				label := ref.Labels[h]
				ref.scores[enc][label] = append(ref.scores[enc][label], p)
			}
		}
	}
	return &ref
}

// tinyEvents spreads the reference sentences over transcripts of two
// sections each, so batches mix lengths and the sentences with a literal
// </s> (BART: another </s> count) meet the others.
func tinyEvents(t *testing.T, ref *tinyReference) (string, []schema.TranscriptEvent) {
	t.Helper()
	var events []schema.TranscriptEvent
	const perCall = 13
	for start := 0; start < len(ref.Sentences); start += perCall {
		s := ref.Sentences[start:min(start+perCall, len(ref.Sentences))]
		half := (len(s) + 1) / 2
		events = append(events, schema.TranscriptEvent{
			CallID:   fmt.Sprintf("tiny-%d", start),
			Sections: map[string][]string{"FILT_MD": s[:half], "FILT_QA": s[half:]},
		})
	}
	path := filepath.Join(t.TempDir(), "tiny.jsonl")
	var b strings.Builder
	for _, ev := range events {
		line, err := json.Marshal(ev)
		if err != nil {
			t.Fatal(err)
		}
		b.Write(line)
		b.WriteByte('\n')
	}
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path, events
}

// checkTinyScores compares each output's scores and flags with the
// reference of its sentences.
func checkTinyScores(t *testing.T, ref *tinyReference, enc string, events []schema.TranscriptEvent, got []schema.ScoredTranscript) {
	t.Helper()
	if len(got) != len(events) {
		t.Fatalf("%d outputs for %d transcripts", len(got), len(events))
	}
	index := map[string]int{}
	for i, s := range ref.Sentences {
		index[s] = i
	}
	byCall := map[string]schema.TranscriptEvent{}
	for _, ev := range events {
		byCall[ev.CallID] = ev
	}
	var worst float64
	checked, flagged := 0, 0
	for _, st := range got {
		ev, ok := byCall[st.CallID]
		if !ok {
			t.Fatalf("output for unknown call %s", st.CallID)
		}
		if st.PairEncoding != enc {
			t.Errorf("%s: pair_encoding %q, want %q", st.CallID, st.PairEncoding, enc)
		}
		for name, sentences := range ev.Sections {
			sec := st.Sections[name]
			for _, label := range ref.Labels {
				res := sec.Results[label]
				if len(res.Scores) != len(sentences) || len(res.Flags) != len(sentences) {
					t.Fatalf("%s/%s/%s: %d scores and %d flags for %d sentences", st.CallID, name, label, len(res.Scores), len(res.Flags), len(sentences))
				}
				for i, s := range sentences {
					want := ref.scores[enc][label][index[s]]
					d := math.Abs(float64(res.Scores[i]) - want)
					worst = math.Max(worst, d)
					if d > tinyTolerance {
						t.Errorf("%s/%s/%s[%d] %.60q: score %v, torch %v (Δ %.2g)", st.CallID, name, label, i, s, res.Scores[i], want, d)
					}
					wantFlag := 0
					if want > tinyThreshold {
						wantFlag = 1
					}
					if res.Flags[i] != wantFlag {
						t.Errorf("%s/%s/%s[%d] %.60q: flag %d, torch's score %v gives %d", st.CallID, name, label, i, s, res.Flags[i], want, wantFlag)
					}
					checked++
					flagged += wantFlag
				}
			}
		}
	}
	if checked != len(ref.Sentences)*len(ref.Labels) {
		t.Errorf("checked %d scores, want %d", checked, len(ref.Sentences)*len(ref.Labels))
	}
	if flagged == 0 || flagged == checked {
		t.Errorf("%d of %d reference decisions are flags: the check would not see a wrong decision", flagged, checked)
	}
	t.Logf("%s: %d scores within %.2g of torch (largest difference), %d flagged", enc, checked, worst, flagged)
}

func tinyEnv(t *testing.T, dir, enc string) map[string]string {
	env := testenv.ScorerEnv(t)
	env["MODEL_DIR"] = dir
	env["THRESHOLD"] = fmt.Sprint(tinyThreshold)
	env["PAIR_ENCODING"] = enc
	return env
}

// TestTinyBPEModelsScore: `scorer score` (the binary, as scoreFile runs it)
// on each tiny model in both pair encodings gives torch's scores within
// 1e-4 and the same decisions.
func TestTinyBPEModelsScore(t *testing.T) {
	for _, name := range tinyBPEModels {
		dir := testenv.ModelDir(t, name)
		ref := loadTinyReference(t, dir)
		in, events := tinyEvents(t, ref)
		for _, enc := range []string{"pair", "joined"} {
			t.Run(name+"/"+enc, func(t *testing.T) {
				checkTinyScores(t, ref, enc, events, scoreFile(t, tinyEnv(t, dir, enc), in))
			})
		}
	}
}

// TestTinyBPEModelsRun: `scorer run` (the binary: ONNX Runtime starts once
// per process, and TestRunEndToEnd runs it in this one) on the in-memory
// broker gives the same
// scores and decisions for each tiny model.
func TestTinyBPEModelsRun(t *testing.T) {
	for _, name := range tinyBPEModels {
		t.Run(name, func(t *testing.T) {
			dir := testenv.ModelDir(t, name)
			ref := loadTinyReference(t, dir)
			file, events := tinyEvents(t, ref)
			cluster, addr, err := broker.Start(broker.Options{Addr: "127.0.0.1:0", Partitions: 2})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(cluster.Close)
			env := tinyEnv(t, dir, "pair")
			metricsAddr := freeAddr(t)
			env["KAFKA_BROKERS"] = addr
			env["METRICS_ADDR"] = metricsAddr
			env["KAFKA_INPUT_PARTITIONS"] = "2"
			p := startScorerProcess(t, env)
			waitReady(t, metricsAddr, 60*time.Second)
			if n := produceFile(t, addr, "transcripts", file); n != len(events) {
				t.Fatalf("produced %d of %d", n, len(events))
			}
			got := decodeScored(t, readTopic(t, addr, "transcripts.scored", len(events), 2*time.Minute))
			checkTinyScores(t, ref, "pair", events, got)
			if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if err := p.cmd.Wait(); err != nil {
				t.Fatalf("scorer run after SIGTERM: %v", err)
			}
		})
	}
}
