package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestCheck feeds the checker ledgers and read-backs whose right answers are
// known: each case breaks (or keeps) one rule.
func TestCheck(t *testing.T) {
	ledger := []sent{
		{call: "a", version: 1, partition: 0, offset: 10},
		{call: "a", version: 2, partition: 0, offset: 11},
		{call: "b", version: 1, partition: 1, offset: 5},
		{call: "P", version: 1, partition: 1, offset: 6, poison: true},
	}
	out := func(call string, version int, offset int64) published {
		return published{call: call, version: version, partition: 0, offset: offset}
	}
	allOut := []published{out("a", 1, 0), out("a", 2, 1), out("b", 1, 2)}
	poisonDLQ := []deadLetter{{call: "P", version: 1, reason: "malformed_json"}}
	cases := []struct {
		name     string
		removals []removal
		outs     []published
		dlq      []deadLetter
		want     tally // the fields compared below
	}{
		{name: "everything once", outs: allOut, dlq: poisonDLQ, want: tally{calls: 2, poison: 1, poisonDLQ: 1}},
		{name: "a replay after a crash: duplicates, in order",
			outs: append(append([]published(nil), allOut...), out("a", 1, 3), out("a", 2, 4)), dlq: poisonDLQ,
			want: tally{calls: 2, poison: 1, poisonDLQ: 1, duplicates: 2}},
		{name: "a revoked member's late write of an older version: a duplicate, last output stale",
			outs: append(append([]published(nil), allOut...), out("a", 1, 3)), dlq: poisonDLQ,
			want: tally{calls: 2, poison: 1, poisonDLQ: 1, duplicates: 1, staleLast: 1}},
		{name: "an older version first written after a newer one",
			outs: []published{out("a", 2, 0), out("a", 1, 1), out("b", 1, 2)}, dlq: poisonDLQ,
			want: tally{calls: 2, poison: 1, poisonDLQ: 1, outOfOrder: 1, staleLast: 1}},
		{name: "newest version missing", outs: []published{out("a", 1, 0), out("b", 1, 1)}, dlq: poisonDLQ,
			want: tally{calls: 2, poison: 1, poisonDLQ: 1, lost: 1}},
		{name: "newest version missing inside a removed span",
			removals: []removal{{why: "truncated", partition: 0, from: 11, to: 20}},
			outs:     []published{out("a", 1, 0), out("b", 1, 1)}, dlq: poisonDLQ,
			want: tally{calls: 2, poison: 1, poisonDLQ: 1}},
		{name: "newest version missing below the span (it was committed)",
			removals: []removal{{why: "truncated", partition: 0, from: 12, to: 20}},
			outs:     []published{out("a", 1, 0), out("b", 1, 1)}, dlq: poisonDLQ,
			want: tally{calls: 2, poison: 1, poisonDLQ: 1, lost: 1}},
		{name: "a span of another topic incarnation excuses nothing",
			removals: []removal{{why: "topic-deleted", epoch: 1, partition: 0, from: 0, to: 20}},
			outs:     []published{out("a", 1, 0), out("b", 1, 1)}, dlq: poisonDLQ,
			want: tally{calls: 2, poison: 1, poisonDLQ: 1, lost: 1}},
		{name: "a valid transcript dead-lettered with a reason", outs: []published{out("a", 1, 0), out("a", 2, 1)},
			dlq:  append([]deadLetter{{call: "b", version: 1, reason: "too_large"}}, poisonDLQ...),
			want: tally{calls: 2, poison: 1, poisonDLQ: 1, validDLQ: 1}},
		{name: "a valid older version dead-lettered beside its output", outs: allOut,
			dlq:  append([]deadLetter{{call: "a", version: 1, reason: "score_failed"}}, poisonDLQ...),
			want: tally{calls: 2, poison: 1, poisonDLQ: 1, validDLQ: 1, duplicates: 1}},
		{name: "a valid transcript dead-lettered without a reason", outs: []published{out("a", 1, 0), out("a", 2, 1)},
			dlq:  append([]deadLetter{{call: "b", version: 1}}, poisonDLQ...),
			want: tally{calls: 2, poison: 1, poisonDLQ: 1, lost: 1, validDLQ: 1}},
		{name: "a dead letter without a reason accounts for nothing", outs: allOut,
			dlq:  []deadLetter{{call: "P", version: 1}},
			want: tally{calls: 2, poison: 1, lost: 1}},
		{name: "poison removed by a fault",
			removals: []removal{{why: "topic-deleted", partition: 1, from: 6, to: 7}}, outs: allOut,
			want: tally{calls: 2, poison: 1, poisonRemoved: 1}},
		{name: "an older version missing", outs: []published{out("a", 2, 0), out("b", 1, 1)}, dlq: poisonDLQ,
			want: tally{calls: 2, poison: 1, poisonDLQ: 1, skipped: 1}},
		{name: "an older version missing inside a removed span",
			removals: []removal{{why: "truncated", partition: 0, from: 10, to: 11}},
			outs:     []published{out("a", 2, 0), out("b", 1, 1)}, dlq: poisonDLQ,
			want: tally{calls: 2, poison: 1, poisonDLQ: 1}},
		{name: "an output of a version never sent", outs: append(append([]published(nil), allOut...), out("a", 3, 3)), dlq: poisonDLQ,
			want: tally{calls: 2, poison: 1, poisonDLQ: 1, phantom: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := check(ledger, c.removals, c.outs, c.dlq)
			type figures struct {
				calls, poison, lost, skipped, outOfOrder, staleLast, duplicates, phantom, poisonDLQ, poisonRemoved, validDLQ int
			}
			g := figures{got.calls, got.poison, got.lost, got.skipped, got.outOfOrder, got.staleLast, got.duplicates, got.phantom,
				got.poisonDLQ, got.poisonRemoved, got.validDLQ}
			w := figures{c.want.calls, c.want.poison, c.want.lost, c.want.skipped, c.want.outOfOrder, c.want.staleLast, c.want.duplicates,
				c.want.phantom, c.want.poisonDLQ, c.want.poisonRemoved, c.want.validDLQ}
			if g != w {
				t.Errorf("got  %+v\nwant %+v", g, w)
			}
		})
	}
}

// TestMakefileSoakTarget keeps `make soak` and its run in `make test`: the
// soak builds what it runs, takes SOAK_MINUTES and SOAK_SEED, and CI runs it
// for two minutes with a fixed seed once the Go tests passed.
func TestMakefileSoakTarget(t *testing.T) {
	data, err := os.ReadFile("../../Makefile")
	if err != nil {
		t.Fatal(err)
	}
	mk := string(data)
	target := regexp.MustCompile(`(?m)^soak:(.*)\n((?:\t.*\n)+)`).FindStringSubmatch(mk)
	if target == nil {
		t.Fatal("the Makefile has no soak target")
	}
	if !strings.Contains(target[1], "$(BIN)") {
		t.Errorf("soak's prerequisites %q do not build the scorer", target[1])
	}
	for _, want := range []string{"./tools/soak", "$(SOAK_MINUTES)", "$(SOAK_SEED)", "$(BIN)"} {
		if !strings.Contains(target[2], want) {
			t.Errorf("soak's recipe lacks %s:\n%s", want, target[2])
		}
	}
	test := regexp.MustCompile(`(?m)^test:.*\n((?:\t.*\n)+)`).FindStringSubmatch(mk)
	if test == nil {
		t.Fatal("the Makefile has no test target")
	}
	// The soak runs in the block that follows the Go tests' success
	// (beside the checks that run after them), not before or without it.
	goTests := strings.Index(test[1], "$(GO) test -race")
	soak := regexp.MustCompile(`if \[ \$\$status -eq 0 \]; then (?:\\\n(?:\t[^\n]*\n)*?\t+)?\$\(MAKE\) soak SOAK_MINUTES=2 SOAK_SEED=[1-9][0-9]* `).FindStringIndex(test[1])
	if soak == nil || goTests < 0 || soak[0] < goTests || strings.Contains(test[1][soak[0]:soak[1]], "fi;") {
		t.Errorf("make test does not run a 2-minute soak with a fixed seed once the Go tests passed:\n%s", test[1])
	}
}
