package tokenizer

import (
	"math/rand/v2"
	"testing"
)

// TestBuildTrie: every piece is found by walking its bytes and ends at the
// id a map built in order gives it (the last of duplicates), prefixes that
// are not pieces end at no id, and the empty piece is never in the trie.
func TestBuildTrie(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	alphabet := []byte("ab\xe2\x96\x81c") // a multi-byte piece marker among plain bytes
	pieces := []string{"", "a", "ab", "a", "abc", "\xe2\x96\x81"}
	for range 3000 {
		b := make([]byte, 1+r.IntN(6))
		for i := range b {
			b[i] = alphabet[r.IntN(len(alphabet))]
		}
		pieces = append(pieces, string(b))
	}
	tr := buildTrie(pieces)
	want := map[string]int32{}
	for i, p := range pieces {
		if p != "" {
			want[p] = int32(i)
		}
	}
	walk := func(s string) int32 {
		node := int32(0)
		for i := 0; i < len(s); i++ {
			if node = tr.child(node, s[i]); node == 0 {
				return -2 // no such path
			}
		}
		return tr.nodes[node].id
	}
	for p, id := range want {
		if got := walk(p); got != id {
			t.Errorf("piece %q: trie id %d, want %d", p, got, id)
		}
		for n := 1; n < len(p); n++ {
			if _, ok := want[p[:n]]; !ok {
				if got := walk(p[:n]); got != -1 {
					t.Errorf("prefix %q of %q is no piece, yet ends at id %d", p[:n], p, got)
				}
			}
		}
	}
	if got := tr.nodes[0].id; got != -1 {
		t.Errorf("root (the empty piece) has id %d, want -1", got)
	}
}
