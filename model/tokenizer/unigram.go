package tokenizer

import (
	"cmp"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode/utf8"
)

// model turns one pre-tokenized word into ids, appending to out. sc holds
// scratch buffers reused across the words of one Encode call.
type model interface {
	tokenize(word string, sc *scratch, out []int32) ([]int32, error)
	vocabSize() int
	lookup(token string) (int32, bool)
}

// scratch is per-call working memory; one Encode call owns it, so the
// Tokenizer itself stays immutable and safe for concurrent use.
type scratch struct {
	nodes []viterbiNode
	ends  []int
	buf   []byte
	syms  []bpeSymbol
	heap  []bpeCandidate
}

// trie is a byte trie over the vocabulary. Children of a node are a sorted
// range of edges; the root, which branches on every first byte, gets a
// direct table so the hottest lookup is one index.
type trie struct {
	root  [256]int32 // child node of the root per byte, 0 = none
	nodes []trieNode
	edges []trieEdge
}

type trieNode struct {
	edgeStart, edgeEnd int32
	id                 int32 // vocab id ending here, -1 if none
}

type trieEdge struct {
	b     byte
	child int32
}

// buildTrie builds the trie breadth-first from the sorted pieces so each
// node's edges are contiguous. A piece listed twice ends at the id of its
// last entry, as a map from piece to id built in order would say. It sorts
// indices, not strings, so no id is looked up by piece.
func buildTrie(pieces []string) *trie {
	order := make([]int32, 0, len(pieces))
	for i, p := range pieces {
		if p != "" {
			order = append(order, int32(i))
		}
	}
	slices.SortFunc(order, func(a, b int32) int {
		return cmp.Or(strings.Compare(pieces[a], pieces[b]), cmp.Compare(a, b))
	})
	// Capacity for a SentencePiece vocabulary's usual 2.2 nodes per piece
	// (DeBERTa-v3: 280,420 for 128,000), so the slices do not regrow.
	guess := len(order)*5/2 + 1
	t := &trie{nodes: make([]trieNode, 1, guess), edges: make([]trieEdge, 0, guess)}
	type pending struct {
		node   int32
		lo, hi int32 // range of order sharing the node's prefix
		depth  int32
	}
	t.nodes[0] = trieNode{id: -1}
	queue := make([]pending, 1, guess)
	queue[0] = pending{node: 0, lo: 0, hi: int32(len(order)), depth: 0}
	for head := 0; head < len(queue); head++ {
		p := queue[head]
		i := p.lo
		// A piece equal to the prefix itself ends here.
		for i < p.hi && len(pieces[order[i]]) == int(p.depth) {
			t.nodes[p.node].id = order[i]
			i++
		}
		start := int32(len(t.edges))
		for i < p.hi {
			b := pieces[order[i]][p.depth]
			j := i
			for j < p.hi && pieces[order[j]][p.depth] == b {
				j++
			}
			child := int32(len(t.nodes))
			t.nodes = append(t.nodes, trieNode{id: -1})
			t.edges = append(t.edges, trieEdge{b: b, child: child})
			if p.node == 0 {
				t.root[b] = child
			}
			queue = append(queue, pending{node: child, lo: i, hi: j, depth: p.depth + 1})
			i = j
		}
		t.nodes[p.node].edgeStart, t.nodes[p.node].edgeEnd = start, int32(len(t.edges))
	}
	return t
}

func (t *trie) child(node int32, b byte) int32 {
	if node == 0 {
		return t.root[b]
	}
	n := t.nodes[node]
	edges := t.edges[n.edgeStart:n.edgeEnd]
	lo, hi := 0, len(edges)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if edges[m].b < b {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo < len(edges) && edges[lo].b == b {
		return edges[lo].child
	}
	return 0
}

// unigram is the SentencePiece Unigram model: the segmentation with the
// highest total log-probability, found by Viterbi over byte positions.
type unigram struct {
	pieces      []string
	scores      []float64
	ids         map[string]int32
	trie        *trie
	unkID       int32 // -1 when the model has none
	unkScore    float64
	byteFallbak bool
	byteIDs     bytePieces
}

// unkPenalty is HF's K_UNK_PENALTY: an unknown character costs 10 nats
// more than the rarest known piece, so known pieces always win when they
// can cover the text.
const unkPenalty = 10.0

func newUnigram(raw json.RawMessage) (*unigram, error) {
	// One decoding pass: each [piece, score] entry straight into Go
	// values, not kept raw and decoded again entry by entry (that doubled
	// Load's time on DeBERTa-v3's 128k pieces).
	var c struct {
		Vocab        [][2]any `json:"vocab"`
		UnkID        *int32   `json:"unk_id"`
		ByteFallback bool     `json:"byte_fallback"`
	}
	if err := json.Unmarshal(raw, &c); err != nil {
		return nil, fmt.Errorf("tokenizer: bad Unigram model: %w", err)
	}
	if len(c.Vocab) == 0 {
		return nil, fmt.Errorf("tokenizer: Unigram model has an empty vocab")
	}
	u := &unigram{
		pieces: make([]string, len(c.Vocab)),
		scores: make([]float64, len(c.Vocab)),
		ids:    make(map[string]int32, len(c.Vocab)),
		unkID:  -1,
	}
	minScore := math.Inf(1)
	for i, e := range c.Vocab {
		piece, ok := e[0].(string)
		if !ok {
			return nil, fmt.Errorf("tokenizer: Unigram vocab entry %d: piece is %T, want a string", i, e[0])
		}
		score, ok := e[1].(float64)
		if !ok {
			return nil, fmt.Errorf("tokenizer: Unigram vocab entry %d (%q) score is %T, want a number", i, piece, e[1])
		}
		u.pieces[i], u.scores[i] = piece, score
		u.ids[piece] = int32(i)
		minScore = min(minScore, score)
	}
	if c.UnkID != nil {
		if *c.UnkID < 0 || int(*c.UnkID) >= len(c.Vocab) {
			return nil, fmt.Errorf("tokenizer: Unigram unk_id %d outside vocab of %d", *c.UnkID, len(c.Vocab))
		}
		u.unkID = *c.UnkID
	}
	u.unkScore = minScore - unkPenalty
	u.byteFallbak = c.ByteFallback
	u.byteIDs = newBytePieces(u.ids)
	u.trie = buildTrie(u.pieces)
	return u, nil
}

func (u *unigram) vocabSize() int { return len(u.pieces) }

func (u *unigram) lookup(token string) (int32, bool) {
	id, ok := u.ids[token]
	return id, ok
}

type viterbiNode struct {
	id       int32
	score    float64
	startsAt int32 // -1 = unreached
}

func (u *unigram) tokenize(word string, sc *scratch, out []int32) ([]int32, error) {
	n := len(word)
	if n == 0 {
		return out, nil
	}
	if cap(sc.nodes) < n+1 {
		sc.nodes = make([]viterbiNode, n+1)
	}
	best := sc.nodes[:n+1]
	for i := range best {
		best[i] = viterbiNode{startsAt: -1}
	}
	best[0].startsAt = 0
	for start := 0; start < n; {
		base := best[start].score
		_, charLen := utf8.DecodeRuneInString(word[start:])
		hasSingle := false
		node := int32(0)
		for pos := start; pos < n; pos++ {
			node = u.trie.child(node, word[pos])
			if node == 0 {
				break
			}
			id := u.trie.nodes[node].id
			if id < 0 {
				continue
			}
			end := pos + 1
			cand := base + u.scores[id]
			if t := &best[end]; t.startsAt < 0 || cand > t.score {
				*t = viterbiNode{id: id, score: cand, startsAt: int32(start)}
			}
			if end-start == charLen {
				hasSingle = true
			}
		}
		if !hasSingle {
			if u.unkID < 0 {
				return out, fmt.Errorf("tokenizer: Unigram model has no unk_id but %q has no piece for %q", word, word[start:start+charLen])
			}
			cand := base + u.unkScore
			if t := &best[start+charLen]; t.startsAt < 0 || cand > t.score {
				*t = viterbiNode{id: u.unkID, score: cand, startsAt: int32(start)}
			}
		}
		start += charLen
	}
	// Walk back collecting piece boundaries; runs of unknowns are fused
	// into one token, as HF's Unigram (fuse_unk) does.
	ends := sc.ends[:0]
	for end := n; end > 0; {
		nd := best[end]
		ends = append(ends, end)
		end = int(nd.startsAt)
	}
	sc.ends = ends
	start := 0
	for i := len(ends) - 1; i >= 0; i-- {
		end := ends[i]
		if best[end].id == u.unkID {
			// Extend over following unknowns.
			for i > 0 && best[ends[i-1]].id == u.unkID {
				i--
				end = ends[i]
			}
		}
		out = u.emit(word[start:end], best[end].id, out)
		start = end
	}
	return out, nil
}

// emit maps a piece string to ids as HF's Unigram::tokenize does: by string
// lookup (so a fused unknown run that happens to be a piece gets its id),
// then byte fallback, then unk.
func (u *unigram) emit(piece string, id int32, out []int32) []int32 {
	if id != u.unkID {
		return append(out, id)
	}
	if known, ok := u.ids[piece]; ok {
		return append(out, known)
	}
	if u.byteFallbak {
		if u.byteIDs.cover(piece) {
			for i := 0; i < len(piece); i++ {
				out = append(out, u.byteIDs[piece[i]])
			}
			return out
		}
	}
	return append(out, u.unkID)
}

// bytePieces are the ids of a vocab's <0xNN> pieces, -1 where it lacks
// one: what byte_fallback spells an unknown piece with, in Unigram and
// BPE alike.
type bytePieces [256]int32

func newBytePieces(vocab map[string]int32) bytePieces {
	var p bytePieces
	for i := range p {
		p[i] = -1
		if id, ok := vocab[fmt.Sprintf("<0x%02X>", i)]; ok {
			p[i] = id
		}
	}
	return p
}

// cover says whether every byte of s has a piece: HF falls back to bytes
// only then, and keeps the unknown token otherwise.
func (p *bytePieces) cover(s string) bool {
	for i := 0; i < len(s); i++ {
		if p[s[i]] < 0 {
			return false
		}
	}
	return true
}
