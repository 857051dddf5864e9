package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

func loadModel(t testing.TB, name string) *Tokenizer {
	t.Helper()
	return loadDir(t, testenv.ModelDir(t, name))
}

// loaded are the shared folders' tokenizers, each loaded once per test
// process: DeBERTa-v3's 8.6 MB tokenizer.json takes seconds of CPU to load
// under the race detector, and the golden, seam and truncation tests each
// asked for every folder's. A Tokenizer is read-only after Load and safe
// for concurrent use (TestConcurrentEncode); TestLoadErrors and the
// benchmarks still call Load themselves.
var (
	loadedMu sync.Mutex
	loaded   = map[string]*Tokenizer{}
)

// loadDir is the tokenizer.json of a folder under shared/models, loaded on
// first use. Tests must not modify it.
func loadDir(t testing.TB, dir string) *Tokenizer {
	t.Helper()
	loadedMu.Lock()
	defer loadedMu.Unlock()
	if tok, ok := loaded[dir]; ok {
		return tok
	}
	tok, err := Load(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	loaded[dir] = tok
	return tok
}

func parseJSON(t *testing.T, js string) *Tokenizer {
	t.Helper()
	tok, err := parse([]byte(js))
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestNormalizers(t *testing.T) {
	cases := []struct {
		name string
		n    normalizer
		in   string
		want string
	}{
		{"strip both", stripNormalizer{true, true}, " \t\u3000a b\n ", "a b"},
		{"strip left", stripNormalizer{left: true}, "  a  ", "a  "},
		{"replace regex", replaceNormalizer{re: mustRegex(t, ` {2,}`), content: " "}, "a  b     c d", "a b c d"},
		{"replace literal", replaceNormalizer{literal: "``", content: `"`}, "``hi``", `"hi"`},
		{"nfc", unicodeNormalizer{form: formOf(t, "NFC")}, "e\u0301", "é"},
		{"nfd", unicodeNormalizer{form: formOf(t, "NFD")}, "é", "e\u0301"},
		{"nfkc", unicodeNormalizer{form: formOf(t, "NFKC")}, "ﬁ①Ａ", "fi1A"},
		{"nfkd", unicodeNormalizer{form: formOf(t, "NFKD")}, "ｅ́", "e\u0301"},
		{"lowercase full mapping", lowercaseNormalizer{}, "İSTANBUL ΣΑΣ", "i\u0307stanbul σασ"},
		{"bert clean", bertNormalizer{cleanText: true}, "a\x00b\u200bc\td\ufffde\u0085f", "abc de f"[:0] + "abc def"},
		{"bert chinese", bertNormalizer{chineseChars: true}, "收入ok", " 收  入 ok"},
		{"bert accents", bertNormalizer{stripAccents: true}, "Ångström naïve", "Angstrom naive"},
		{"bert all", bertNormalizer{true, true, true, true}, "Café\u00a0中", "cafe  中 "},
		{"strip accents only marks", stripAccentsNormalizer{}, "e\u0301é", "eé"},
		{"sequence", normalizerSeq{stripNormalizer{true, true}, lowercaseNormalizer{}}, " AB ", "ab"},
	}
	for _, c := range cases {
		if got := c.n.normalize(c.in); got != c.want {
			t.Errorf("%s: normalize(%q) = %q, want %q", c.name, c.in, got, c.want)
		}
	}
}

// TestPrecompiled checks the charsmap from the real Unigram model against
// what SentencePiece's nmt_nfkc rules do. DeBERTa-v3's older charsmap
// differs (it turns ZWJ into a space); the golden files check it against
// the reference.
func TestPrecompiled(t *testing.T) {
	tok := loadModel(t, "nli-unigram-small")
	var p *precompiled
	for _, n := range tok.norm.(normalizerSeq) {
		if pn, ok := n.(precompiledNormalizer); ok {
			p = pn.p
		}
	}
	if p == nil {
		t.Fatal("no Precompiled normalizer in nli-unigram-small")
	}
	cases := map[string]string{
		"plain ascii":  "plain ascii",
		"ＡＢＣ１２３":       "ABC123",
		"ﬁnance":       "finance",
		"a\u2581b":     "a b", // the metaspace char is a space to SentencePiece
		"Cafe\u0301":   "Café",
		"tab\there":    "tab here",
		"x\u200by":     "x y", // nmt_nfkc turns zero-width space into a space
		"👨‍👩‍👧 family": "👨‍👩‍👧 family",
	}
	for in, want := range cases {
		if got := p.normalize(in); got != want {
			t.Errorf("precompiled(%q) = %q, want %q", in, got, want)
		}
	}
	if _, err := newPrecompiled("!!"); err == nil {
		t.Error("bad base64 accepted")
	}
	if _, err := newPrecompiled("AAEAAA=="); err == nil {
		t.Error("trie size beyond blob accepted")
	}
}

func TestPreTokenizers(t *testing.T) {
	cases := []struct {
		name  string
		p     preTokenizer
		in    string
		first bool
		want  []string
	}{
		{"metaspace always", metaspace{"▁", prependAlways, true}, "hello big world", false, []string{"▁hello", "▁big", "▁world"}},
		{"metaspace double space", metaspace{"▁", prependAlways, true}, "a  b", true, []string{"▁a", "▁", "▁b"}},
		{"metaspace already prefixed", metaspace{"▁", prependAlways, true}, " a", true, []string{"▁a"}},
		{"metaspace first, not first", metaspace{"▁", prependFirst, true}, "a b", false, []string{"a", "▁b"}},
		{"metaspace first, first", metaspace{"▁", prependFirst, true}, "a b", true, []string{"▁a", "▁b"}},
		{"metaspace never, no split", metaspace{"▁", prependNever, false}, "a b", true, []string{"a▁b"}},
		{"metaspace empty", metaspace{"▁", prependAlways, true}, "", true, nil},
		{"bert", bertPreTokenizer{}, "Hello, world! It's $1,234.56 «ok»", false,
			[]string{"Hello", ",", "world", "!", "It", "'", "s", "$", "1", ",", "234", ".", "56", "«", "ok", "»"}},
		{"bert whitespace kinds", bertPreTokenizer{}, "a\u3000b\u00a0c\td", false, []string{"a", "b", "c", "d"}},
		{"whitespace split", whitespaceSplit{}, "  a,b \n c  ", false, []string{"a,b", "c"}},
		{"whitespace", whitespacePre{}, "Hey friend!!  How're_you?", false, []string{"Hey", "friend", "!!", "How", "'", "re_you", "?"}},
		{"sequence", preTokenizerSeq{whitespaceSplit{}, bertPreTokenizer{}}, "a,b c", false, []string{"a", ",", "b", "c"}},
	}
	for _, c := range cases {
		if got := c.p.split(c.in, c.first, nil); !slices.Equal(got, c.want) {
			t.Errorf("%s: split(%q) = %q, want %q", c.name, c.in, got, c.want)
		}
	}
}

const tinyWordPiece = `{
  "added_tokens": [
    {"id": 0, "content": "[PAD]", "special": true},
    {"id": 1, "content": "[UNK]", "special": true},
    {"id": 2, "content": "[CLS]", "special": true},
    {"id": 3, "content": "[SEP]", "special": true},
    {"id": 9, "content": "<ls>", "special": true, "lstrip": true, "rstrip": true},
    {"id": 10, "content": "<w>", "special": true, "single_word": true}
  ],
  "normalizer": {"type": "BertNormalizer", "lowercase": true, "strip_accents": null},
  "pre_tokenizer": {"type": "BertPreTokenizer"},
  "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 10,
    "vocab": {"[PAD]": 0, "[UNK]": 1, "[CLS]": 2, "[SEP]": 3, "un": 4, "##aff": 5, "##able": 6, "a": 7, ",": 8}},
  "post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]}
}`

func TestWordPieceAndAddedTokens(t *testing.T) {
	tok := parseJSON(t, tinyWordPiece)
	cases := []struct {
		in   string
		want []int32
	}{
		{"unaffable", []int32{4, 5, 6}},
		{"UNAFFABLE, a", []int32{4, 5, 6, 8, 7}},
		{"unaffablez", []int32{1}},        // one unmatched piece makes the word unknown
		{"unaffableable", []int32{1}},     // longer than max_input_chars_per_word
		{"a <ls>  a", []int32{7, 9, 7}},   // lstrip/rstrip swallow the spaces
		{"a<ls>a", []int32{7, 9, 7}},      // no spaces to strip is fine too
		{"a <w> a", []int32{7, 10, 7}},    // a whole word: matched
		{"a<w>a", []int32{7, 1, 1, 1, 7}}, // inside a word: not added; < w > are unknown words
		{"[CLS]a[SEP]", []int32{2, 7, 3}}, // specials matched in raw text
		{"[cls]", []int32{1, 1, 1}},       // case matters: "[", "cls", "]" are unknown
	}
	for _, c := range cases {
		got, err := tok.Encode(c.in)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.in, got, c.want)
		}
	}
	pair := tok.EncodePair([]int32{7}, []int32{4}, 0)
	if !slices.Equal(pair.IDs, []int32{2, 7, 3, 4, 3}) || !slices.Equal(pair.TypeIDs, []int32{0, 0, 0, 1, 1}) {
		t.Errorf("BertProcessing pair = %+v", pair)
	}
	// The single template: [CLS] A [SEP], type ids 0; "<" ">" are unknown words.
	if j, err := tok.EncodeJoined("a", "<w>", "unaffable", 0); err != nil || !slices.Equal(j.IDs, []int32{2, 7, 1, 1, 1, 4, 5, 6, 3}) || !slices.Equal(j.TypeIDs, make([]int32, 9)) {
		t.Errorf("BertProcessing single = %+v, %v", j, err)
	}
}

const tinyUnigram = `{
  "added_tokens": [{"id": 0, "content": "<pad>", "special": true}],
  "padding": {"pad_id": 5},
  "normalizer": null,
  "pre_tokenizer": {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "always", "split": true},
  "model": {"type": "Unigram", "unk_id": 1, "byte_fallback": %s, "vocab": [
    ["<pad>", 0], ["<unk>", 0], ["▁", -2], ["a", -1], ["b", -1], ["ab", -1.5], ["▁ab", -1],
    ["<0xC3>", -5], ["<0xA9>", -5], ["<0xE2>", -5], ["<0x82>", -5], ["<0xAC>", -5]]},
  "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 2], "cls": ["<s>", 0]}
}`

func TestUnigram(t *testing.T) {
	tok := parseJSON(t, strings.Replace(tinyUnigram, "%s", "false", 1))
	cases := []struct {
		in   string
		want []int32
	}{
		{"ab", []int32{6}},            // "▁ab" beats "▁"+"ab" (-1 > -3.5)
		{"aab", []int32{2, 3, 5}},     // ▁ a ab
		{"xyz", []int32{2, 1}},        // consecutive unknowns fuse into one unk
		{"axyb", []int32{2, 3, 1, 4}}, // unknown run between known pieces
		{"", nil},
	}
	for _, c := range cases {
		got, err := tok.Encode(c.in)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("Encode(%q) = %v, want %v", c.in, got, c.want)
		}
	}
	if tok.PadID() != 5 {
		t.Errorf("PadID = %d, want padding.pad_id 5", tok.PadID())
	}
	// RoBERTa: <s> A </s></s> B </s>, all type ids 0.
	pair := tok.EncodePair([]int32{3}, []int32{4}, 0)
	if !slices.Equal(pair.IDs, []int32{0, 3, 2, 2, 4, 2}) || !slices.Equal(pair.TypeIDs, make([]int32, 6)) {
		t.Errorf("RobertaProcessing pair = %+v", pair)
	}
	// Single: <s> A </s>; "a"+"b" joined is the one word "▁ab".
	if j, err := tok.EncodeJoined("a", "", "b", 0); err != nil || !slices.Equal(j.IDs, []int32{0, 6, 2}) {
		t.Errorf("RobertaProcessing single = %+v, %v", j, err)
	}

	fb := parseJSON(t, strings.Replace(tinyUnigram, "%s", "true", 1))
	got, err := fb.Encode("aé€x")
	if err != nil {
		t.Fatal(err)
	}
	// é and € fall back to their bytes; x has no byte pieces so stays unk.
	// They are fused first, so the fallback applies to "é€x" as a whole,
	// which fails on x: HF then emits one unk for the fused run.
	if want := []int32{2, 3, 1}; !slices.Equal(got, want) {
		t.Errorf("byte fallback Encode = %v, want %v", got, want)
	}
	got, _ = fb.Encode("aé€")
	if want := []int32{2, 3, 7, 8, 9, 10, 11}; !slices.Equal(got, want) {
		t.Errorf("byte fallback Encode = %v, want %v", got, want)
	}
}

// TestEncodePairTruncation: both Unigram models here (ours and DeBERTa-v3)
// have [PAD] 0, [CLS] 1, [SEP] 2 and the template [CLS] A [SEP] B:1 [SEP]:1.
func TestEncodePairTruncation(t *testing.T) {
	for _, name := range []string{"nli-unigram-small", testenv.ProductionArch} {
		t.Run(name, func(t *testing.T) { checkPairTruncation(t, loadModel(t, name)) })
	}
}

func checkPairTruncation(t *testing.T, tok *Tokenizer) {
	if n := tok.NumSpecialTokensPair(); n != 3 {
		t.Fatalf("NumSpecialTokensPair = %d, want 3 ([CLS] [SEP] [SEP])", n)
	}
	if tok.PadID() != 0 {
		t.Errorf("PadID = %d, want 0 ([PAD])", tok.PadID())
	}
	prem := []int32{10, 11, 12, 13, 14, 15}
	hyp := []int32{20, 21}
	p := tok.EncodePair(prem, hyp, 8)
	if want := []int32{1, 10, 11, 12, 2, 20, 21, 2}; !slices.Equal(p.IDs, want) {
		t.Errorf("truncated IDs = %v, want %v", p.IDs, want)
	}
	if want := []int32{0, 0, 0, 0, 0, 1, 1, 1}; !slices.Equal(p.TypeIDs, want) {
		t.Errorf("TypeIDs = %v, want %v", p.TypeIDs, want)
	}
	if p.Len() != 8 {
		t.Errorf("Len = %d", p.Len())
	}
	// The hypothesis alone is too long: premise dropped, hypothesis cut.
	p = tok.EncodePair(prem, []int32{20, 21, 22, 23, 24, 25}, 6)
	if want := []int32{1, 2, 20, 21, 22, 2}; !slices.Equal(p.IDs, want) {
		t.Errorf("over-long hypothesis IDs = %v, want %v", p.IDs, want)
	}
	// No limit.
	if p := tok.EncodePair(prem, hyp, 0); p.Len() != 11 {
		t.Errorf("unlimited Len = %d, want 11", p.Len())
	}
	// Inputs are not modified.
	if !slices.Equal(prem, []int32{10, 11, 12, 13, 14, 15}) {
		t.Error("EncodePair modified its input")
	}
}

func TestEncodeJoinedTruncation(t *testing.T) {
	tok := loadModel(t, "nli-unigram-small")
	if n := tok.NumSpecialTokensSingle(); n != 2 {
		t.Fatalf("NumSpecialTokensSingle = %d, want 2 ([CLS] [SEP])", n)
	}
	const sep, hyp = "</s></s>", "This text is about consumer weakness."
	tail, err := tok.Encode(sep + hyp)
	if err != nil {
		t.Fatal(err)
	}
	premise := strings.Repeat("Consumers pulled back on discretionary spending. ", 40)
	for _, maxLen := range []int{len(tail) + 3, len(tail) + 40, 64, 200} {
		p, err := tok.EncodeJoined(premise, sep, hyp, maxLen)
		if err != nil {
			t.Fatal(err)
		}
		if p.Len() > maxLen || p.Len() < maxLen-4 || len(p.TypeIDs) != p.Len() {
			t.Errorf("max %d: %d ids, %d type ids; want a premise cut to just fit", maxLen, p.Len(), len(p.TypeIDs))
		}
		if p.IDs[0] != 1 || p.IDs[p.Len()-1] != 2 {
			t.Errorf("max %d: %v does not keep [CLS] … [SEP]", maxLen, p.IDs)
		}
		// The hypothesis survives whole: the ids end as the hypothesis's own
		// (its first word may be glued to the separator, the rest is not).
		hypIDs, _ := tok.Encode(hyp)
		if got := p.IDs[p.Len()-1-(len(hypIDs)-1) : p.Len()-1]; !slices.Equal(got, hypIDs[1:]) {
			t.Errorf("max %d: ids end %v, want the hypothesis's %v", maxLen, got, hypIDs[1:])
		}
	}
	// Without a limit, or under it, nothing is cut.
	whole, _ := tok.Encode(premise + sep + hyp)
	if p, _ := tok.EncodeJoined(premise, sep, hyp, 0); p.Len() != len(whole)+2 {
		t.Errorf("unlimited: %d ids, want %d", p.Len(), len(whole)+2)
	}
	// The hypothesis alone over the limit: cut at the end, never over.
	if p, _ := tok.EncodeJoined(premise, sep, hyp, 5); p.Len() != 5 || !slices.Equal(p.IDs[1:4], tail[:3]) {
		t.Errorf("over-long hypothesis: %v, want [CLS] + the first 3 of %v + [SEP]", p.IDs, tail)
	}
	if _, err := tok.EncodeJoined("a\xffb", sep, hyp, 64); !errors.Is(err, ErrInvalidUTF8) {
		t.Errorf("invalid UTF-8: err = %v", err)
	}
}

func TestLoadErrors(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cases := []struct {
		name, path, wantSub string
	}{
		{"missing", filepath.Join(dir, "nope.json"), "nope.json"},
		{"malformed", write("bad.json", `{"model": `), "malformed tokenizer.json"},
		{"no model", write("nomodel.json", `{"normalizer": null}`), "no model"},
		{"wordlevel", write("wordlevel.json", `{"model": {"type": "WordLevel", "vocab": {}, "unk_token": "[UNK]"}}`), `unsupported model type "WordLevel" (supported: BPE, Unigram, WordPiece)`},
		{"normalizer", write("norm.json", strings.Replace(tinyWordPiece, `"type": "BertNormalizer"`, `"type": "Nmt"`, 1)), `unsupported normalizer type "Nmt"`},
		{"pre", write("pre.json", strings.Replace(tinyWordPiece, `"type": "BertPreTokenizer"`, `"type": "CharDelimiterSplit"`, 1)), `unsupported pre_tokenizer type "CharDelimiterSplit"`},
		{"post", write("post.json", strings.Replace(tinyWordPiece, `"type": "BertProcessing"`, `"type": "Template"`, 1)), `unsupported post_processor type "Template"`},
		{"single B", write("single.json", strings.Replace(tinyWordPiece, `"post_processor": {"type": "BertProcessing", "sep": ["[SEP]", 3], "cls": ["[CLS]", 2]}`,
			`"post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "B", "type_id": 0}}], "pair": [], "special_tokens": {}}`, 1)), `single piece 0 has sequence "B", want A`},
		{"unk", write("unk.json", strings.Replace(tinyWordPiece, `"unk_token": "[UNK]"`, `"unk_token": "<nope>"`, 1)), `unk_token "<nope>"`},
	}
	for _, c := range cases {
		_, err := Load(c.path)
		if err == nil || !strings.Contains(err.Error(), c.wantSub) || !strings.HasPrefix(err.Error(), "tokenizer: ") {
			t.Errorf("%s: Load error = %v, want one containing %q", c.name, err, c.wantSub)
		}
	}
}

func TestInvalidUTF8(t *testing.T) {
	for _, dir := range testenv.TokenizerDirs(t) {
		tok, name := loadDir(t, dir), filepath.Base(dir)
		for _, in := range []string{"\xff", "ok\xc3", "a\xed\xa0\x80b"} {
			ids, err := tok.Encode(in)
			if !errors.Is(err, ErrInvalidUTF8) || ids != nil {
				t.Errorf("%s: Encode(%q) = %v, %v; want ErrInvalidUTF8", name, in, ids, err)
			}
		}
	}
}

// TestHugeInput runs a 1 MB sentence through every tokenizer: no panic,
// ids in range, and it finishes (the Viterbi lattice is linear in bytes).
func TestHugeInput(t *testing.T) {
	in := strings.Repeat("Revenue grew 12% to $1.2B — 收入增长 🚀 ", 1<<20/48)
	for _, dir := range testenv.TokenizerDirs(t) {
		tok, name := loadDir(t, dir), filepath.Base(dir)
		ids, err := tok.Encode(in)
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) < len(in)/20 {
			t.Errorf("%s: only %d ids for %d bytes", name, len(ids), len(in))
		}
		checkRange(t, tok, ids)
	}
}

func checkRange(t testing.TB, tok *Tokenizer, ids []int32) {
	t.Helper()
	for _, id := range ids {
		if id < 0 || int(id) >= tok.vocabSize {
			t.Fatalf("id %d outside vocab of %d", id, tok.vocabSize)
		}
	}
}

// TestConcurrentEncode shares one Tokenizer across goroutines (run with
// -race) and checks each gets the serial answer.
func TestConcurrentEncode(t *testing.T) {
	tok := loadModel(t, testenv.ProductionArch)
	sentences := []string{"Demand was strong across all regions.", "Margins fell 3% 😕", "[MASK] café ＡＢＣ", ""}
	want := make([][]int32, len(sentences))
	for i, s := range sentences {
		want[i], _ = tok.Encode(s)
	}
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := 0; r < 200; r++ {
				i := (g + r) % len(sentences)
				got, err := tok.Encode(sentences[i])
				if err != nil || !slices.Equal(got, want[i]) {
					t.Errorf("concurrent Encode(%q) = %v, %v; want %v", sentences[i], got, err, want[i])
					return
				}
			}
		}()
	}
	wg.Wait()
}
