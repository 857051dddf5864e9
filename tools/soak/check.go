package main

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"
)

// sent is one input record the producer wrote and the broker acknowledged.
type sent struct {
	call      string
	version   int
	epoch     int // incarnation of the input topic: a delete and re-create starts the next
	partition int32
	offset    int64
	poison    bool      // malformed JSON: must reach the DLQ, never the output
	at        time.Time // when the broker acknowledged it
}

// removal is a span of one partition's log that a fault took away before the
// scorer had to have read it: [from, to) in offsets of one topic incarnation.
// from is the group's commit when the fault struck (read before it), so an
// input below it was committed, hence published, and is never excused.
type removal struct {
	why       string // "truncated" (DeleteRecords) or "topic-deleted"
	epoch     int
	partition int32
	from, to  int64
	// waited is how long the span's oldest record had been in the log,
	// unread by the group, when the fault struck.
	waited time.Duration
}

// published is one record read back from the output topic, in the order of
// its output partition (outputs are keyed by call_id: one partition a call).
type published struct {
	call      string
	version   int
	partition int32
	offset    int64
}

// deadLetter is one record read back from the DLQ.
type deadLetter struct {
	call    string
	version int // 0 when the value does not decode (poison)
	reason  string
}

// tally is what the checker found; violations says which bounds broke.
type tally struct {
	calls, poison int
	lost          int
	lostCalls     []string // the first few, for the report
	removed       map[string]int
	skipped       int // older versions with neither output nor dead letter, not removed
	skippedCalls  []string
	outOfOrder    int
	oooCalls      []string
	staleLast     int // calls whose last output is not their newest version
	duplicates    int
	phantom       int // outputs of a (call, version) never sent
	poisonDLQ     int
	poisonRemoved int // poison records a fault removed before they were read
	// validDLQ is the dead letters, of any version and with a reason or
	// not, of well-formed transcripts: the soak sends none the scorer may
	// reject, so each is a scorer's mistake (a transient error taken for a
	// permanent one, a wrong limit), never an accounting.
	validDLQ      int
	validDLQCalls []string
	dlqReasons    map[string]int
}

type versionKey struct {
	call    string
	version int
}

// check compares what was sent with what came out. The rules:
//   - lost: a call whose newest version has neither an output nor a dead
//     letter with a reason, unless that record lies in a removed span;
//   - valid dead letters: every dead letter of a well-formed transcript
//     (it accounts for its input, but the verdict bounds it at 0);
//   - out of order: in a call's output order, the first output of a version
//     after the first output of a newer one (a replay of an older version
//     after a newer one is a duplicate, not a reordering: the scorer writes
//     a replayed span again in order, and a revoked member's last request
//     may land late, see docs/reliability.md);
//   - skipped: the same for a call's older versions (not removed either);
//   - duplicates: records (outputs and dead letters) beyond the first of each
//     (call, version).
func check(ledger []sent, removals []removal, outs []published, dlq []deadLetter) tally {
	t := tally{removed: map[string]int{}, dlqReasons: map[string]int{}}
	newest := map[string]sent{}
	sentKeys := map[versionKey]bool{}
	valid := map[versionKey]bool{}
	for _, s := range ledger {
		sentKeys[versionKey{s.call, s.version}] = true
		if !s.poison {
			valid[versionKey{s.call, s.version}] = true
		}
		if n, ok := newest[s.call]; !ok || s.version > n.version {
			newest[s.call] = s
		}
	}
	outCount := map[versionKey]int{}
	for _, o := range outs {
		k := versionKey{o.call, o.version}
		outCount[k]++
		if !sentKeys[k] {
			t.phantom++
		}
	}
	dlqCount := map[versionKey]int{}
	for _, d := range dlq {
		t.dlqReasons[d.reason]++
		if valid[versionKey{d.call, d.version}] {
			t.validDLQ++
			if len(t.validDLQCalls) < 5 {
				t.validDLQCalls = append(t.validDLQCalls, fmt.Sprintf("%s v%d %s", d.call, d.version, cmpOr(d.reason, "(no reason)")))
			}
		}
		if d.reason == "" {
			continue // a dead letter without a reason does not account for its input
		}
		dlqCount[versionKey{d.call, d.version}]++
	}
	for _, k := range sortedKeys(newest) {
		s := newest[k]
		vk := versionKey{s.call, s.version}
		if s.poison {
			t.poison++
			if dlqCount[vk] > 0 {
				t.poisonDLQ++
				continue
			}
		} else {
			t.calls++
			if outCount[vk] > 0 {
				continue
			}
			if dlqCount[vk] > 0 {
				continue // accounted for, and counted in validDLQ
			}
		}
		if why := removedBy(s, removals); why != "" {
			t.removed[why]++
			if s.poison {
				t.poisonRemoved++
			}
			continue
		}
		t.lost++
		if len(t.lostCalls) < 5 {
			t.lostCalls = append(t.lostCalls, fmt.Sprintf("%s v%d (input %d/%d epoch %d)", s.call, s.version, s.partition, s.offset, s.epoch))
		}
	}
	// Every older version too: the scorer skips none (a superseded version is
	// scored like any other), so one without an output or dead letter that
	// no fault removed was skipped.
	for _, s := range ledger {
		vk := versionKey{s.call, s.version}
		if s.version == newest[s.call].version || outCount[vk] > 0 || dlqCount[vk] > 0 || removedBy(s, removals) != "" {
			continue
		}
		t.skipped++
		if len(t.skippedCalls) < 5 {
			t.skippedCalls = append(t.skippedCalls, fmt.Sprintf("%s v%d (input %d/%d epoch %d)", s.call, s.version, s.partition, s.offset, s.epoch))
		}
	}
	for k, n := range outCount {
		t.duplicates += n - 1
		if dlqCount[k] > 0 {
			t.duplicates += dlqCount[k] // both published and dead-lettered
		}
	}
	for k, n := range dlqCount {
		if outCount[k] == 0 {
			t.duplicates += n - 1
		}
	}

	// Order per call, in output-partition order.
	byCall := map[string][]published{}
	for _, o := range outs {
		byCall[o.call] = append(byCall[o.call], o)
	}
	for _, call := range sortedKeys(byCall) {
		os := byCall[call]
		slices.SortFunc(os, func(a, b published) int {
			return cmp.Or(cmp.Compare(a.partition, b.partition), cmp.Compare(a.offset, b.offset))
		})
		seen := map[int]bool{}
		top, bad := 0, false
		for _, o := range os {
			if o.partition != os[0].partition {
				bad = true // one key, two output partitions: no order to speak of
				continue
			}
			if !seen[o.version] {
				seen[o.version] = true
				if o.version < top {
					bad = true
				}
			}
			top = max(top, o.version)
		}
		if bad {
			t.outOfOrder++
			if len(t.oooCalls) < 5 {
				t.oooCalls = append(t.oooCalls, call+" "+versionsOf(os))
			}
		}
		if os[len(os)-1].version != top {
			t.staleLast++
		}
	}
	return t
}

func removedBy(s sent, removals []removal) string {
	for _, r := range removals {
		if r.epoch == s.epoch && r.partition == s.partition && s.offset >= r.from && s.offset < r.to {
			return r.why
		}
	}
	return ""
}

func versionsOf(os []published) string {
	var b strings.Builder
	for i, o := range os {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "v%d@%d/%d", o.version, o.partition, o.offset)
	}
	return b.String()
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// oldestWait is how long, at now, the oldest record of ledger at or past
// offset from in partition p of topic incarnation epoch had been in the log:
// 0 when the ledger has none there.
func oldestWait(ledger []sent, epoch int, p int32, from int64, now time.Time) time.Duration {
	var oldest time.Time
	for _, s := range ledger {
		if s.epoch == epoch && s.partition == p && s.offset >= from && (oldest.IsZero() || s.at.Before(oldest)) {
			oldest = s.at
		}
	}
	if oldest.IsZero() {
		return 0
	}
	return now.Sub(oldest)
}
