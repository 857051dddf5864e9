package tokenizer

import (
	"bufio"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

// realSentences reads every n-th transcript line's sentences, up to limit,
// so the benchmark sees the corpus's real length and character mix.
func realSentences(b *testing.B, limit int) []string {
	b.Helper()
	f, err := os.Open(testenv.Transcripts(b))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var out []string
	for line := 0; sc.Scan() && len(out) < limit; line++ {
		if line%13 != 0 {
			continue
		}
		var ev struct {
			Sections map[string][]string `json:"sections"`
		}
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			b.Fatal(err)
		}
		out = append(out, ev.Sections["FILT_MD"]...)
		out = append(out, ev.Sections["FILT_QA"]...)
	}
	if err := sc.Err(); err != nil {
		b.Fatal(err)
	}
	if len(out) > limit {
		out = out[:limit]
	}
	if len(out) == 0 {
		b.Fatal("no sentences")
	}
	return out
}

func benchEncode(b *testing.B, model string) {
	tok := loadModel(b, model)
	sentences := realSentences(b, 5000)
	var bytes int
	for _, s := range sentences {
		bytes += len(s)
	}
	b.SetBytes(int64(bytes / len(sentences)))
	b.ResetTimer()
	tokens := 0
	for i := 0; i < b.N; i++ {
		ids, err := tok.Encode(sentences[i%len(sentences)])
		if err != nil {
			b.Fatal(err)
		}
		tokens += len(ids)
	}
	b.ReportMetric(float64(tokens)/b.Elapsed().Seconds(), "tokens/s")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "sentences/s")
}

// BenchmarkEncodeUnigram measures the SentencePiece pipeline (charsmap,
// Metaspace, Viterbi) on real transcript sentences.
func BenchmarkEncodeUnigram(b *testing.B) { benchEncode(b, "nli-unigram-small") }

// BenchmarkEncodeBPE measures the byte-level BPE pipeline (GPT-2 split,
// byte mapping, merges through the shared merge cache) of the tiny
// RoBERTa/BART models on the same text.
func BenchmarkEncodeBPE(b *testing.B) { benchEncode(b, "nli-roberta-bpe-tiny") }

// BenchmarkEncodeWordPiece measures the BERT pipeline on the same text.
func BenchmarkEncodeWordPiece(b *testing.B) { benchEncode(b, "nli-wordpiece-small") }

// BenchmarkLoadDeBERTa measures Load on the real DeBERTa-v3 tokenizer.json
// (128,000 Unigram pieces, 8.7 MB): part of every start-up.
func BenchmarkLoadDeBERTa(b *testing.B) {
	path := filepath.Join(testenv.ModelDir(b, testenv.ProductionArch), "tokenizer.json")
	for b.Loop() {
		if _, err := Load(path); err != nil {
			b.Fatal(err)
		}
	}
}
