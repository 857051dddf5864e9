package model

import (
	"path/filepath"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

// TestModelName: results and scorer_build_info name the model. The chart
// and both images mount every model at /models, so the folder's name says
// nothing there: config.json's _name_or_path names it when it is a Hugging
// Face Hub id (owner/name, what save_pretrained writes after from_pretrained
// of a Hub model), LoadOptions.Name (MODEL_NAME) wins over both, and a local
// path in _name_or_path (a folder the model was saved from) is not a name.
func TestModelName(t *testing.T) {
	src := testenv.ModelDir(t, "nli-wordpiece-small")
	for _, tc := range []struct {
		name, nameOrPath, option string
		want                     string // "" = the folder's base name
	}{
		{"hub id", "MoritzLaurer/deberta-v3-large-zeroshot-v2.0", "", "MoritzLaurer/deberta-v3-large-zeroshot-v2.0"},
		{"setting wins", "MoritzLaurer/deberta-v3-large-zeroshot-v2.0", "consumer-weakness-v3", "consumer-weakness-v3"},
		{"absolute local path", "/tmp/finetune/checkpoint-500", "", ""},
		{"relative local path", "./out/model", "", ""},
		{"parent path", "../models/x", "", ""},
		{"absent", "", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := copyModelDir(t, src, func(cfg map[string]any) {
				if tc.nameOrPath != "" {
					cfg["_name_or_path"] = tc.nameOrPath
				}
			})
			m := loadModel(t, LoadOptions{Dir: dir, Name: tc.option})
			want := tc.want
			if want == "" {
				want = filepath.Base(dir)
			}
			if m.Name != want || m.Info().Name != want {
				t.Errorf("_name_or_path %q, Name option %q: model name %q (results' %q), want %q", tc.nameOrPath, tc.option, m.Name, m.Info().Name, want)
			}
		})
	}
}
