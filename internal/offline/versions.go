package offline

import (
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"strings"

	"github.com/scorer/scorer/producer"
	"github.com/scorer/scorer/schema"
)

// A table has no offsets. The stream's rule is that the last record of a
// key a sink receives wins, and it publishes a call's versions in input
// order, so once every version is consumed a sink holds the newest. A
// table's rows come in part-file order, which follows Spark's tasks, not
// versions; and an upsert of an older, longer version after a newer one
// would also leave its extra sentences behind. So `scorer score` finds,
// before scoring, each key's newest version by version_id (the order
// reliability.md tells a reader to keep) and writes that version's rows
// only: its Parquet rows hold one version per key, whatever order the
// table gives.

// versionKey is what one output row set is keyed on under OUTPUT_KEY:
// the call, or the seed's dedup key (entity_id, event_time). It returns
// an error wrapping schema.ErrNoEventKey for a record that has no
// entity_event key: the stream dead-letters it (output_rejected), and
// offline it is a bad record.
type versionKey func(ev *schema.TranscriptEvent) (string, error)

// keyOf returns OUTPUT_KEY's versionKey.
func keyOf(outputKey string) versionKey {
	if outputKey == producer.KeyEntityEvent {
		return func(ev *schema.TranscriptEvent) (string, error) {
			k, err := schema.NewEventKey(ev.CallID, ev.EntityID, ev.EventTime)
			return k.EntityID + "\x00" + k.EventTime, err
		}
	}
	return func(ev *schema.TranscriptEvent) (string, error) { return ev.CallID, nil }
}

// newerVersion reports whether version_id a is newer than b: as integers
// when both are (9 before 10, however many digits), else as text. Equal
// versions are neither; the later in the input wins then, as on a topic.
func newerVersion(a, b string) bool {
	if isDigits(a) && isDigits(b) {
		a, b = strings.TrimLeft(a, "0"), strings.TrimLeft(b, "0")
		if len(a) != len(b) {
			return len(a) > len(b)
		}
	}
	return a > b
}

func isDigits(s string) bool {
	if s == "" {
		return false
	}
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return true
}

// superseded reads the whole input once (ctx stops it) and returns the positions (in
// src's order, counting every record) of the versions a newer one of the
// same key replaces. Records that do not decode or have no key are left
// to the scoring pass, which reports them where they are. Memory is one
// entry per key (a 16-byte digest and a version_id), not per sentence.
func superseded(ctx context.Context, src source, key versionKey, lim schema.Limits) (map[int]struct{}, error) {
	type newest struct {
		pos     int
		version string
	}
	byKey := map[[16]byte]newest{}
	out := map[int]struct{}{}
	for pos := 0; ; pos++ {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		rec, err := src.next()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		if rec.err != nil {
			continue
		}
		ev, err := schema.DecodeEvent(rec.data, lim)
		if err != nil {
			continue
		}
		k, err := key(&ev)
		if err != nil {
			continue
		}
		d := sha256.Sum256([]byte(k))
		id := [16]byte(d[:16])
		if prev, ok := byKey[id]; ok {
			if newerVersion(prev.version, ev.VersionID) {
				out[pos] = struct{}{}
				continue
			}
			out[prev.pos] = struct{}{}
		}
		byKey[id] = newest{pos: pos, version: ev.VersionID}
	}
}
