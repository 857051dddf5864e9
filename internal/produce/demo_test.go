package produce

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

// TestStandInNote: every shared model folder says of itself that it is a
// test stand-in, and the demo reads that from the folder (config.json's
// _note, else SOURCE.txt's first line), not from its name; a folder that
// says nothing of the kind, as a real export, is not flagged.
func TestStandInNote(t *testing.T) {
	for _, dir := range testenv.ModelDirs(t) {
		note, ok := standInNote(dir)
		if !ok || note.text == "" {
			t.Errorf("%s: not recognised as a test stand-in", dir)
		}
		t.Logf("%s: %s: %q", filepath.Base(dir), note.source, note.text)
	}
	for _, c := range []struct {
		name, config, source string
		want                 bool
		from                 string
	}{
		{"export", `{"architectures":["DebertaV2ForSequenceClassification"],"id2label":{"0":"entailment","1":"not_entailment"}}`, "", false, ""},
		{"export with a note", `{"_note":"exported with optimum-cli on 2026-11-20","id2label":{}}`, "", false, ""},
		{"source only", `{"id2label":{}}`, "big-model -- RANDOM weights, for speed tests\nmore", true, "SOURCE.txt"},
		{"note", `{"_note":"tiny model with random weights; scores are meaningless"}`, "", true, "config.json"},
		{"provenance only", `{"id2label":{}}`, "deberta-zeroshot -- exported from the hub\nnot for tests", false, ""},
		{"random weights further down", `{"id2label":{}}`, "hf-tiny: HF's own export\n\nWhat it is\n- tiny shape, RANDOM weights (seed 0)", true, "SOURCE.txt"},
	} {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "config.json"), []byte(c.config), 0o644); err != nil {
			t.Fatal(err)
		}
		if c.source != "" {
			if err := os.WriteFile(filepath.Join(dir, "SOURCE.txt"), []byte(c.source), 0o644); err != nil {
				t.Fatal(err)
			}
		}
		note, ok := standInNote(dir)
		if ok != c.want || note.source != c.from {
			t.Errorf("%s: standInNote = %+v, %v; want a stand-in %v from %q", c.name, note, ok, c.want, c.from)
		}
	}
}
