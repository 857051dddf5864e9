package model_test

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/scorer/scorer/internal/testenv"
	"github.com/scorer/scorer/model"
)

// Load reads a model folder: the classes from config.json's id2label (here
// entailment is class 1), the tokenizer, and the ONNX graph's inputs. A
// Session scores encoded pairs on ONNX Runtime, which ortenv.InitRuntime must have
// started (this package's TestMain does).
func ExampleLoad() {
	dir := filepath.Join(testenv.RepoRoot(), "..", "shared", "models", "nli-wordpiece-small")
	m, err := model.Load(model.LoadOptions{Dir: dir})
	if err != nil {
		panic(err)
	}
	fmt.Println(m.Name, m.ID2Label, "entailment", m.EntailmentIndex, "max length", m.MaxLength)
	fmt.Println(m.InputNames)

	pair, err := m.EncodeText("Consumers pulled back on discretionary purchases.", "This text is about consumer weakness.")
	if err != nil {
		panic(err)
	}
	s, err := m.NewSession(model.SessionOptions{IntraOpThreads: 1})
	if err != nil {
		panic(err)
	}
	defer s.Close()
	scores, err := s.ScorePairs(context.Background(), []model.Pair{pair})
	if err != nil {
		panic(err)
	}
	fmt.Println(len(scores), "score, a probability:", scores[0] >= 0 && scores[0] <= 1)
	// Output:
	// nli-wordpiece-small [contradiction entailment neutral] entailment 1 max length 512
	// [input_ids attention_mask token_type_ids]
	// 1 score, a probability: true
}
