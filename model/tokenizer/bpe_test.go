package tokenizer

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
)

// tinyBPE is a hand-made BPE whose ids, for the inputs below, are HF
// tokenizers 0.22.2's (checked once through tools/golden's npm binding).
// Merges: "b c" ranks first, so "abc" merges b+c before a+b and then a+bc.
const tinyBPE = `{
  "added_tokens": [],
  "normalizer": null,
  "pre_tokenizer": {"type": "WhitespaceSplit"},
  "post_processor": null,
  "model": {"type": "BPE", "dropout": null, "unk_token": %s, "fuse_unk": %s, "byte_fallback": %s, "ignore_merges": %s,
    "vocab": {"<unk>": 0, "a": 1, "b": 2, "c": 3, "ab": 4, "bc": 5, "abc": 6, "<0x78>": 7, "<0xC3>": 8, "<0xA9>": 9},
    "merges": %s}
}`

func tinyBPEWith(unk, fuse, fallback, ignore, merges string) string {
	return fmt.Sprintf(tinyBPE, unk, fuse, fallback, ignore, merges)
}

const pairMerges = `[["b", "c"], ["a", "b"], ["a", "bc"], ["ab", "c"]]`

func TestBPE(t *testing.T) {
	inputs := []string{"abc", "abcab", "bcbc", "axxb", "aé", "xéq", "zzb", "ab c abc", "qaq"}
	cases := []struct {
		name string
		json string
		want [][]int32
	}{
		{"pairs", tinyBPEWith(`"<unk>"`, "false", "false", "false", pairMerges),
			[][]int32{{6}, {6, 4}, {5, 5}, {1, 0, 0, 2}, {1, 0}, {0, 0, 0}, {0, 0, 2}, {4, 3, 6}, {0, 1, 0}}},
		// The "a b" strings of files written before tokenizers 0.20, with
		// the "#version" header some carry: the same merges, the same ids.
		{"legacy strings", tinyBPEWith(`"<unk>"`, "false", "false", "false", `["#version: 0.2", "b c", "a b", "a bc", "ab c"]`),
			[][]int32{{6}, {6, 4}, {5, 5}, {1, 0, 0, 2}, {1, 0}, {0, 0, 0}, {0, 0, 2}, {4, 3, 6}, {0, 1, 0}}},
		{"fuse_unk", tinyBPEWith(`"<unk>"`, "true", "false", "false", pairMerges),
			[][]int32{{6}, {6, 4}, {5, 5}, {1, 0, 2}, {1, 0}, {0}, {0, 2}, {4, 3, 6}, {0, 1, 0}}},
		// Bytes with a <0xNN> piece fall back to it; a pending unk is
		// emitted after them ("xéq": x, é's two bytes, then q's unk).
		{"byte_fallback", tinyBPEWith(`"<unk>"`, "false", "true", "false", pairMerges),
			[][]int32{{6}, {6, 4}, {5, 5}, {1, 7, 7, 2}, {1, 8, 9}, {7, 8, 9, 0}, {0, 0, 2}, {4, 3, 6}, {0, 1, 0}}},
		// No unk token: unknown characters vanish, and "axxb" merges to ab.
		{"no unk", tinyBPEWith("null", "false", "false", "false", pairMerges),
			[][]int32{{6}, {6, 4}, {5, 5}, {4}, {1}, {}, {2}, {4, 3, 6}, {1}}},
		// ignore_merges: a word in the vocab is its own token, merges or not.
		{"ignore_merges", tinyBPEWith(`"<unk>"`, "false", "false", "true", `[["a", "b"]]`),
			[][]int32{{6}, {4, 3, 4}, {2, 3, 2, 3}, {1, 0, 0, 2}, {1, 0}, {0, 0, 0}, {0, 0, 2}, {4, 3, 6}, {0, 1, 0}}},
	}
	for _, c := range cases {
		tok := parseJSON(t, c.json)
		for i, in := range inputs {
			got, err := tok.Encode(in)
			if err != nil {
				t.Fatalf("%s: Encode(%q): %v", c.name, in, err)
			}
			// Twice: the second answer comes from the merge cache.
			again, _ := tok.Encode(in)
			if !slices.Equal(got, c.want[i]) || !slices.Equal(again, c.want[i]) {
				t.Errorf("%s: Encode(%q) = %v then %v, want %v", c.name, in, got, again, c.want[i])
			}
		}
	}
}

// TestBPEPrefixSuffix: continuing_subword_prefix marks every character but
// the first, end_of_word_suffix the last; a merged token carries the
// prefix once (HF cuts it off the right part). Ids are HF's.
func TestBPEPrefixSuffix(t *testing.T) {
	tok := parseJSON(t, `{"pre_tokenizer": {"type": "WhitespaceSplit"}, "model": {"type": "BPE", "unk_token": "<unk>",
	  "continuing_subword_prefix": "##", "end_of_word_suffix": "</w>",
	  "vocab": {"<unk>": 0, "a": 1, "##b": 2, "##c": 3, "ab": 4, "##c</w>": 5, "ab##c</w>": 6, "b</w>": 7, "##b</w>": 8, "ab</w>": 9, "abc</w>": 10},
	  "merges": [["a", "##b"], ["ab", "##c</w>"], ["a", "##b</w>"]]}}`)
	for in, want := range map[string][]int32{"abc": {10}, "ab": {9}, "b": {7}, "abb": {4, 8}} {
		if got, err := tok.Encode(in); err != nil || !slices.Equal(got, want) {
			t.Errorf("Encode(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
}

// TestBPEUnkMissing: HF loads a BPE whose unk_token is not in the vocab
// and fails only when a word needs it; so does Load/Encode here.
func TestBPEUnkMissing(t *testing.T) {
	tok := parseJSON(t, tinyBPEWith(`"<nope>"`, "false", "false", "false", pairMerges))
	if ids, err := tok.Encode("abc"); err != nil || !slices.Equal(ids, []int32{6}) {
		t.Errorf("Encode(abc) = %v, %v", ids, err)
	}
	if _, err := tok.Encode("aqa"); err == nil || !strings.Contains(err.Error(), `unk_token "<nope>" is not in the vocab`) {
		t.Errorf("Encode(aqa) error = %v, want one naming the missing unk_token", err)
	}
}

func TestByteLevelPreTokenizer(t *testing.T) {
	cases := []struct {
		name string
		p    preTokenizer
		in   string
		want []string
	}{
		// HF's own unit tests of byte_level.rs, then pieces HF 0.22.2's
		// pre_tokenize_str gives (through tools/golden's npm binding).
		{"words", byteLevel{useRegex: true}, "Hello my friend, how is your day going?",
			[]string{"Hello", "Ġmy", "Ġfriend", ",", "Ġhow", "Ġis", "Ġyour", "Ġday", "Ġgoing", "?"}},
		{"no regex", byteLevel{addPrefixSpace: true}, "Hello my friend, how",
			[]string{"ĠHelloĠmyĠfriend,Ġhow"}},
		{"prefix space", byteLevel{addPrefixSpace: true, useRegex: true}, "Hello my", []string{"ĠHello", "Ġmy"}},
		{"prefix space already there", byteLevel{addPrefixSpace: true, useRegex: true}, " Hello my", []string{"ĠHello", "Ġmy"}},
		{"newlines", byteLevel{useRegex: true}, "Hello there\nHello there", []string{"Hello", "Ġthere", "Ċ", "Hello", "Ġthere"}},
		{"multiple spaces", byteLevel{useRegex: true}, "Hello there       dear", []string{"Hello", "Ġthere", "ĠĠĠĠĠĠ", "Ġdear"}},
		{"char split up", byteLevel{useRegex: true}, "i⭢j", []string{"i", "âŃ¢", "j"}},
		// \s+(?!\S): a run leaves its last character to what follows, all
		// of it at the end; a lone \n or \t before a word is \s+ alone
		// (the optional prefix is U+0020 only).
		{"whitespace rules", byteLevel{useRegex: true}, "a \n\tb  \nc\n", []string{"a", "ĠĊ", "ĉ", "b", "ĠĠ", "Ċ", "c", "Ċ"}},
		{"contractions", byteLevel{useRegex: true}, "it's we'll 'sup O'Neil 'RE", []string{"it", "'s", "Ġwe", "'ll", "Ġ'", "sup", "ĠO", "'", "Neil", "Ġ'", "RE"}},
		{"numbers and other", byteLevel{useRegex: true}, "$1.5B (+12%)", []string{"$", "1", ".", "5", "B", "Ġ(+", "12", "%)"}},
		{"unicode classes", byteLevel{useRegex: true}, "Ⅻ½ naïve\u00a0x", []string{"âħ«Â½", "ĠnaÃ¯ve", "Âł", "x"}},
	}
	for _, c := range cases {
		if got := c.p.split(c.in, true, nil); !slices.Equal(got, c.want) {
			t.Errorf("%s: split(%q) = %q, want %q", c.name, c.in, got, c.want)
		}
	}
}

func TestSplitPreTokenizer(t *testing.T) {
	lit := literalMatcher(" ")
	dash := literalMatcher("-")
	re := func(p string) matcher {
		m, err := translateRegex(p)
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	cases := []struct {
		name string
		p    splitPre
		in   string
		want []string
	}{
		// HF's own unit tests of split.rs, then pieces HF 0.22.2 gives.
		{"removed", splitPre{m: lit, behavior: splitRemoved}, "How are you doing?", []string{"How", "are", "you", "doing?"}},
		{"isolated", splitPre{m: lit, behavior: splitIsolated}, "How are you doing?", []string{"How", " ", "are", " ", "you", " ", "doing?"}},
		{"merged with previous", splitPre{m: lit, behavior: splitMergedWithPrevious}, "How are you doing?", []string{"How ", "are ", "you ", "doing?"}},
		{"merged with next", splitPre{m: lit, behavior: splitMergedWithNext}, "How are you doing?", []string{"How", " are", " you", " doing?"}},
		{"contiguous", splitPre{m: dash, behavior: splitContiguous}, "The-final--countdown", []string{"The", "-", "final", "--", "countdown"}},
		{"invert", splitPre{m: re(`\w+`), behavior: splitRemoved, invert: true}, "Hi, you!", []string{"Hi", "you"}},
		{"regex isolated", splitPre{m: re(`\d+`), behavior: splitIsolated}, "ab12cd٣4", []string{"ab", "12", "cd", "٣4"}},
		// GPT-2's pattern through Split equals the ByteLevel split.
		{"gpt2 pattern", splitPre{m: re(`'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`), behavior: splitIsolated},
			"a \n\tb  \nc\n it's\u3000x", []string{"a", " \n", "\t", "b", "  ", "\n", "c", "\n", " it", "'s", "\u3000", "x"}},
		// Without the final \s+, a lone space before a word matches nothing.
		{"lookahead only", splitPre{m: re(`\s+(?!\S)`), behavior: splitIsolated}, "a b  c ", []string{"a b", " ", " c", " "}},
	}
	for _, c := range cases {
		if got := c.p.split(c.in, true, nil); !slices.Equal(got, c.want) {
			t.Errorf("%s: split(%q) = %q, want %q", c.name, c.in, got, c.want)
		}
	}
}

func TestTranslateRegexRefuses(t *testing.T) {
	for pat, want := range map[string]string{
		`a(?=b)`:      "lookaround",
		`(?<!x)a`:     "lookaround",
		`\bword\b`:    `\b is not supported`,
		`[^\S\n]+`:    `\S inside a character class`,
		`\p{N}{1,3}+`: "possessive",
		`a++`:         "possessive",
		`\s+(?!\S)|a`: "lookaround",
	} {
		if _, err := translateRegex(pat); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("translateRegex(%q) error = %v, want one containing %q", pat, err, want)
		}
	}
}

// TestBPELoadErrors: what a user sees for each BPE feature that is refused.
func TestBPELoadErrors(t *testing.T) {
	dir := t.TempDir()
	base := tinyBPEWith(`"<unk>"`, "false", "false", "false", pairMerges)
	cases := []struct {
		name, body, want string
	}{
		{"dropout", strings.Replace(base, `"dropout": null`, `"dropout": 0.1`, 1), "BPE dropout 0.1 is not supported"},
		{"merge token", strings.Replace(base, `["a", "bc"]`, `["a", "zz"]`, 1), `BPE merge 2 ("a" "zz"): "zz" is not in the vocab`},
		{"merged token", strings.Replace(base, `["ab", "c"]`, `["c", "c"]`, 1), `the merged token "cc" is not in the vocab`},
		{"bad legacy merge", tinyBPEWith(`"<unk>"`, "false", "false", "false", `["a b c"]`), "not two tokens separated by one space"},
		{"no merges", strings.Replace(base, `"merges"`, `"merges_"`, 1), "BPE model has no merges"},
		{"split behavior", strings.Replace(base, `{"type": "WhitespaceSplit"}`, `{"type": "Split", "pattern": {"String": " "}, "behavior": "Sideways"}`, 1), `unsupported Split behavior "Sideways"`},
		{"split regex", strings.Replace(base, `{"type": "WhitespaceSplit"}`, `{"type": "Split", "pattern": {"Regex": "\\bx"}, "behavior": "Isolated"}`, 1), `unsupported Split regex "\\bx"`},
		{"pre", strings.Replace(base, `{"type": "WhitespaceSplit"}`, `{"type": "Digits", "individual_digits": true}`, 1), `unsupported pre_tokenizer type "Digits"`},
		{"post sequence", strings.Replace(base, `"post_processor": null`, `"post_processor": {"type": "Sequence", "processors": [
			{"type": "RobertaProcessing", "sep": ["c", 3], "cls": ["a", 1]}, {"type": "BertProcessing", "sep": ["c", 3], "cls": ["a", 1]}]}`, 1), "Sequence of RobertaProcessing and BertProcessing"},
	}
	for _, c := range cases {
		path := filepath.Join(dir, strings.ReplaceAll(c.name, " ", "-")+".json")
		if err := os.WriteFile(path, []byte(c.body), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := Load(path)
		if err == nil || !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), path) || !strings.HasPrefix(err.Error(), "tokenizer: ") {
			t.Errorf("%s: Load error = %v, want one containing %q and the path", c.name, err, c.want)
		}
	}
}

// TestPostProcessorSequence: ByteLevel (offsets only) beside a template
// changes nothing; alone it is HF's default layout (type ids 0 then 1).
func TestPostProcessorSequence(t *testing.T) {
	base := tinyBPEWith(`"<unk>"`, "false", "false", "false", pairMerges)
	seq := parseJSON(t, strings.Replace(base, `"post_processor": null`, `"post_processor": {"type": "Sequence", "processors": [
		{"type": "ByteLevel", "trim_offsets": true}, {"type": "RobertaProcessing", "sep": ["c", 3], "cls": ["a", 1]}]}`, 1))
	if p := seq.EncodePair([]int32{6}, []int32{4}, 0); !slices.Equal(p.IDs, []int32{1, 6, 3, 3, 4, 3}) || !slices.Equal(p.TypeIDs, make([]int32, 6)) {
		t.Errorf("Sequence[ByteLevel, RobertaProcessing] pair = %+v", p)
	}
	bl := parseJSON(t, strings.Replace(base, `"post_processor": null`, `"post_processor": {"type": "ByteLevel", "trim_offsets": true}`, 1))
	if p := bl.EncodePair([]int32{6}, []int32{4}, 0); !slices.Equal(p.IDs, []int32{6, 4}) || !slices.Equal(p.TypeIDs, []int32{0, 1}) {
		t.Errorf("ByteLevel pair = %+v", p)
	}
}

// TestBPEConcurrent shares one BPE tokenizer, and so its merge cache,
// across goroutines (run with -race).
func TestBPEConcurrent(t *testing.T) {
	tok := parseJSON(t, tinyBPEWith(`"<unk>"`, "false", "true", "false", pairMerges))
	inputs := []string{"abc abcab", "bcbc axxb", "aé xéq", strings.Repeat("ab", 200)}
	want := make([][]int32, len(inputs))
	for i, s := range inputs {
		want[i], _ = tok.Encode(s)
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range 200 {
				i := (g + r) % len(inputs)
				if got, err := tok.Encode(inputs[i]); err != nil || !slices.Equal(got, want[i]) {
					t.Errorf("concurrent Encode(%q) = %v, %v; want %v", inputs[i], got, err, want[i])
					return
				}
			}
		}()
	}
	wg.Wait()
	if _, err := tok.Encode("a\xff"); !errors.Is(err, ErrInvalidUTF8) {
		t.Errorf("invalid UTF-8: %v", err)
	}
}
