package model

import (
	"path/filepath"
	"strings"
	"testing"

	"github.com/scorer/scorer/internal/testenv"
)

// TestPadToMultipleOf scores real transcript pairs on every shared model
// (default load: DeBERTa's rewritten attention included) in batches padded
// to their longest pair and padded further to multiples of 8 and of 7
// (PAD_TO_MULTIPLE_OF): the extra positions are masked like any pad, so
// the logits agree within 1e-5 in fp32 and every decision at 0.5 is the
// same. Each batch's padded length is checked through buildInputs, so a
// session that ignored the option would fail as well as one that left the
// extra positions visible to attention.
func TestPadToMultipleOf(t *testing.T) {
	var sentences []string
	for _, ev := range testenv.FirstTranscripts(t, 1, 5) {
		for _, sec := range ev.Sections {
			sentences = append(sentences, sec...)
		}
	}
	for _, dir := range testenv.ModelDirs(t) {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			m := sharedModel(t, dir)
			pairs := make([]Pair, len(sentences))
			odd := 0
			for i, s := range sentences {
				p, err := m.EncodeText(s, "This text is about consumer weakness.")
				if err != nil {
					t.Fatal(err)
				}
				pairs[i] = p
				if len(p.IDs)%8 != 0 {
					odd++
				}
			}
			if odd == 0 {
				t.Fatal("every pair is a multiple of 8 tokens long: padding is not exercised")
			}
			want, wantP := scoreSortedBatches(t, newSession(t, m), m, pairs)
			for _, k := range []int{8, 7} {
				opts := noSpinning
				opts.IntraOpThreads, opts.InterOpThreads, opts.PadToMultipleOf = 2, 1, k
				s := openSession(t, m, opts)
				_, rows, length, err := s.buildInputs(pairs[:3])
				if err != nil {
					t.Fatal(err)
				}
				longest := max(len(pairs[0].IDs), len(pairs[1].IDs), len(pairs[2].IDs))
				if wantLen := min((longest+k-1)/k*k, m.MaxLength); rows != 3 || length != wantLen {
					t.Fatalf("pad to %d: first pairs (longest %d) built as %d×%d, want 3×%d", k, longest, rows, length, wantLen)
				}
				got, gotP := scoreSortedBatches(t, s, m, pairs)
				d := maxDiff(want, got)
				if d > 1e-5 {
					t.Errorf("pad to %d: max |Δlogit| %.3g against unpadded > 1e-5", k, d)
				}
				t.Logf("pad to %d: %d pairs (%d not a multiple of 8 long): max |Δlogit| %.3g", k, len(pairs), odd, d)
				for i := range wantP {
					if (wantP[i] >= 0.5) != (gotP[i] >= 0.5) {
						t.Errorf("pad to %d: pair %d's decision changed: %v unpadded, %v padded", k, i, wantP[i], gotP[i])
					}
				}
			}
		})
	}
}

// TestPadLength: rounded up to the multiple, never past the model's
// maximum length (position embeddings end there), and unchanged with 0 or
// 1 or at a multiple.
func TestPadLength(t *testing.T) {
	for _, tc := range []struct{ n, k, maxLen, want int }{
		{33, 8, 512, 40}, {40, 8, 512, 40}, {1, 8, 512, 8}, {33, 1, 512, 33}, {33, 0, 512, 33},
		{509, 8, 512, 512}, {509, 8, 510, 510}, {510, 8, 510, 510}, {33, 7, 512, 35},
	} {
		if got := padLength(tc.n, tc.k, tc.maxLen); got != tc.want {
			t.Errorf("padLength(%d, %d, max %d) = %d, want %d", tc.n, tc.k, tc.maxLen, got, tc.want)
		}
	}
}

// TestMemoryKeyPadToMultipleOf: calibrations are kept per padding, since
// a padded session runs (and allocates for) other shapes; 0 and 1 are
// both no padding and keep the key they had before the option existed.
func TestMemoryKeyPadToMultipleOf(t *testing.T) {
	m := sharedModel(t, testenv.ModelDir(t, "nli-wordpiece-small"))
	keys := map[int]string{}
	for _, k := range []int{0, 1, 8} {
		s := openSession(t, m, SessionOptions{IntraOpThreads: 1, PadToMultipleOf: k})
		keys[k] = s.MemoryKey()
	}
	if keys[0] == "" || keys[0] != keys[1] || keys[8] == keys[0] || !strings.Contains(keys[8], "pad_to=8") {
		t.Errorf("keys without padding %q, padding to 1 %q, to 8 %q: want the first two equal and the third apart, naming pad_to=8", keys[0], keys[1], keys[8])
	}
}
