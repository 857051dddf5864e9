package tokenizer

import (
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"strings"
	"unicode/utf8"

	"github.com/rivo/uniseg"
)

// precompiled is SentencePiece's compiled normalization rules (the
// precompiled_charsmap of nmt_nfkc and friends): a Darts double-array trie
// over UTF-8 bytes whose leaves point into a pool of NUL-terminated
// replacement strings. It reproduces HF's spm_precompiled crate, including
// its quirks, because the model's vocabulary was built through it.
type precompiled struct {
	units []uint32
	pool  string
}

func newPrecompiled(b64 string) (*precompiled, error) {
	blob, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return nil, fmt.Errorf("tokenizer: precompiled_charsmap is not base64: %w", err)
	}
	if len(blob) < 4 {
		return nil, fmt.Errorf("tokenizer: precompiled_charsmap too short (%d bytes)", len(blob))
	}
	trieSize := int(binary.LittleEndian.Uint32(blob))
	if trieSize%4 != 0 || 4+trieSize > len(blob) {
		return nil, fmt.Errorf("tokenizer: precompiled_charsmap trie size %d does not fit %d bytes", trieSize, len(blob))
	}
	units := make([]uint32, trieSize/4)
	for i := range units {
		units[i] = binary.LittleEndian.Uint32(blob[4+4*i:])
	}
	pool := string(blob[4+trieSize:])
	if !utf8.ValidString(pool) {
		return nil, fmt.Errorf("tokenizer: precompiled_charsmap replacement pool is not UTF-8")
	}
	if len(units) == 0 {
		return nil, fmt.Errorf("tokenizer: precompiled_charsmap has an empty trie")
	}
	return &precompiled{units: units, pool: pool}, nil
}

// Darts unit layout (see sentencepiece's darts.h): label in the low byte
// plus bit 31, has-leaf in bit 8, offset in the high bits with an optional
// extra shift, value in the low 31 bits of a leaf unit.
func unitOffset(u uint32) uint32 { return (u >> 10) << ((u & (1 << 9)) >> 6) }
func unitLabel(u uint32) uint32  { return u & ((1 << 31) | 0xff) }
func unitHasLeaf(u uint32) bool  { return (u>>8)&1 == 1 }
func unitValue(u uint32) uint32  { return u & ((1 << 31) - 1) }

// firstPrefix returns the value of the SHORTEST key that is a prefix of key.
// spm_precompiled takes results[0] of a common-prefix search, i.e. the
// shortest, not the longest match; matching HF means copying that.
func (p *precompiled) firstPrefix(key string) (uint32, bool) {
	units := p.units
	pos := unitOffset(units[0])
	for i := 0; i < len(key); i++ {
		c := key[i]
		if c == 0 {
			return 0, false
		}
		pos ^= uint32(c)
		if int(pos) >= len(units) {
			return 0, false
		}
		u := units[pos]
		if unitLabel(u) != uint32(c) {
			return 0, false
		}
		pos ^= unitOffset(u)
		if unitHasLeaf(u) {
			if int(pos) >= len(units) {
				return 0, false
			}
			return unitValue(units[pos]), true
		}
	}
	return 0, false
}

func (p *precompiled) transform(chunk string) (string, bool) {
	v, ok := p.firstPrefix(chunk)
	if !ok || int(v) > len(p.pool) {
		return "", false
	}
	rest := p.pool[v:]
	if i := strings.IndexByte(rest, 0); i >= 0 {
		rest = rest[:i]
	}
	return rest, true
}

// normalize follows HF's Precompiled normalizer: a grapheme cluster shorter
// than 6 bytes is replaced as a whole when a rule matches (a prefix of) it;
// otherwise each of its characters is looked up on its own.
func (p *precompiled) normalize(s string) string {
	var b strings.Builder
	b.Grow(len(s) + len(s)/8)
	state := -1
	for len(s) > 0 {
		var g string
		if c := s[0]; c < utf8.RuneSelf && c != '\r' && (len(s) == 1 || s[1] < utf8.RuneSelf) {
			// ASCII followed by ASCII is always its own grapheme (CR LF is
			// the one ASCII cluster), which spares the segmenter.
			g, state = s[:1], -1
		} else {
			g, _, _, state = uniseg.FirstGraphemeClusterInString(s, state)
		}
		s = s[len(g):]
		if len(g) < 6 {
			if norm, ok := p.transform(g); ok {
				b.WriteString(norm)
				continue
			}
		}
		for i, r := range g {
			part := g[i : i+utf8.RuneLen(r)]
			if norm, ok := p.transform(part); ok {
				b.WriteString(norm)
			} else {
				b.WriteString(part)
			}
		}
	}
	return b.String()
}
