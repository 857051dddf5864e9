package main

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestVerdict starts from the outcome of a clean run, which must PASS, and
// breaks one bound in each case, which must FAIL naming what broke. The
// clean run sits just inside every new bound (a stall and a removed span's
// wait just under the catch-up time), so a bound set too tight fails it.
func TestVerdict(t *testing.T) {
	opt := options{seed: 20261129, minutes: 2, partitions: 3, maxUncommit: 200, catchUp: 5 * time.Minute,
		maxRSSDrift: 128, maxGoroutines: 50}
	clean := func() outcome {
		return outcome{
			sent: 300,
			t: tally{calls: 120, poison: 3, poisonDLQ: 3, duplicates: 40, removed: map[string]int{"topic-deleted": 2},
				dlqReasons: map[string]int{"malformed_json": 3}},
			removals: []removal{{why: "topic-deleted", partition: 1, from: 50, to: 52, waited: opt.catchUp - time.Second}},
			counts:   map[string]int{"kill": 3, "leave": 1, "join": 1, "topic-recreate": 1, "poison": 3},
			replays:  5, caughtUpIn: time.Second, backlog: 4,
			stall: stalls{longest: opt.catchUp - time.Second, where: "partition 0 from 60s"},
			exits: map[string][]string{},
			base:  sample{rss: 100 << 20, goroutines: 30}, last: sample{rss: 140 << 20, goroutines: 38},
			peak: sample{rss: 150 << 20, goroutines: 46},
			logs: map[string]int{"generation started": 40},
		}
	}
	cases := []struct {
		name   string
		change func(o *outcome)
		want   string // in one broken bound; "" = PASS
	}{
		{name: "clean"},
		{name: "a valid transcript dead-lettered", want: "valid transcripts dead-lettered 1",
			change: func(o *outcome) {
				o.t.validDLQ, o.t.validDLQCalls = 1, []string{"c-7 v2 too_large"}
				o.t.dlqReasons["too_large"] = 1
			}},
		{name: "scorer B crashed", want: "scorer B exited by itself: exit status 2",
			change: func(o *outcome) { o.exits["B"] = []string{"exit status 2"} }},
		{name: "scorer D crashed", want: "scorer D exited by itself: signal: segmentation fault",
			change: func(o *outcome) { o.exits["D"] = []string{"signal: segmentation fault"} }},
		{name: "scorer A exited", want: "scorer A exited by itself: exit 0",
			change: func(o *outcome) { o.exits["A"] = []string{"exit 0"} }},
		{name: "a SIGTERM exit not clean", want: "SIGTERM exits not clean: C: exit status 1",
			change: func(o *outcome) { o.termErrors = []string{"C: exit status 1"} }},
		{name: "a SIGTERM exit past its wait", want: "SIGTERM exits not clean: B at the end: no exit within 40s",
			change: func(o *outcome) { o.termErrors = []string{"B at the end: no exit within 40s of terminated"} }},
		{name: "a stall longer than the catch-up time", want: "commit stalled 5m1s (bound 5m0s, the catch-up time): partition 0 from 60s",
			change: func(o *outcome) { o.stall.longest = opt.catchUp + time.Second }},
		// The watcher samples every 2 s and sees a commit that moves at
		// all; the removed span's wait is read at the fault from the
		// ledger, so a partition crawling (or stuck between two failed
		// samples) still fails.
		{name: "a stuck partition excused by a later re-creation",
			want: "partition 1 epoch 0 [50,90) excused as topic-deleted after its oldest record waited 6m0s unread (bound 5m0s",
			change: func(o *outcome) {
				o.removals = append(o.removals, removal{why: "topic-deleted", partition: 1, from: 50, to: 90, waited: 6 * time.Minute})
				o.t.removed["topic-deleted"] += 40
			}},
		{name: "a stuck partition excused by a truncation",
			want: "partition 2 epoch 3 [7,9) excused as truncated after its oldest record waited 5m30s",
			change: func(o *outcome) {
				o.removals = append(o.removals, removal{why: "truncated", epoch: 3, partition: 2, from: 7, to: 9, waited: 330 * time.Second})
			}},
		{name: "lost", want: "lost 1: c-1 v3",
			change: func(o *outcome) { o.t.lost, o.t.lostCalls = 1, []string{"c-1 v3 (input 0/5 epoch 0)"} }},
		{name: "not caught up", want: "not caught up after 5m0s: 2: committed 10, end 20",
			change: func(o *outcome) { o.behind = "2: committed 10, end 20" }},
		{name: "duplicates over the bound", want: "duplicates 3001 over the bound 3000",
			change: func(o *outcome) { o.t.duplicates = 3001 }},
		{name: "A's metrics unread", want: "scorer A's metrics at the end: refused",
			change: func(o *outcome) { o.scrapeErr = errors.New("refused") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			o := clean()
			if c.change != nil {
				c.change(&o)
			}
			line, broken := verdict(opt, o)
			joined := strings.Join(broken, "\n")
			switch {
			case c.want == "" && (len(broken) > 0 || !strings.HasPrefix(line, "soak PASS: ")):
				t.Errorf("want PASS, got %d broken:\n%s\n%s", len(broken), joined, line)
			case c.want != "" && !strings.HasPrefix(line, "soak FAIL: "):
				t.Errorf("want FAIL (%s), got: %s", c.want, line)
			case c.want != "" && !strings.Contains(joined, c.want):
				t.Errorf("want a broken bound with %q, got:\n%s", c.want, joined)
			case c.want != "" && len(broken) != 1:
				t.Errorf("want one broken bound, got %d:\n%s", len(broken), joined)
			}
		})
	}
}

// TestVerdictLinePrintsValidDeadLetters: the line says how many valid
// transcripts were dead-lettered and names them, as it does for lost ones.
func TestVerdictLinePrintsValidDeadLetters(t *testing.T) {
	o := outcome{t: tally{calls: 2, validDLQ: 1, validDLQCalls: []string{"c-7 v2 too_large"}, removed: map[string]int{},
		dlqReasons: map[string]int{"too_large": 1}}, exits: map[string][]string{}}
	line, broken := verdict(options{catchUp: time.Minute}, o)
	if !strings.Contains(line, " valid_dead_lettered=1 ") {
		t.Errorf("the line lacks valid_dead_lettered=1: %s", line)
	}
	if !strings.Contains(strings.Join(broken, "\n"), "c-7 v2 too_large") {
		t.Errorf("the broken bound does not name the dead letter: %q", broken)
	}
}

// TestOldestWait: a removed span's wait is that of its oldest record the
// ledger holds in the partition and incarnation, from the span's start.
func TestOldestWait(t *testing.T) {
	t0 := time.Date(2026, 12, 8, 1, 0, 0, 0, time.UTC)
	ledger := []sent{
		{call: "a", version: 1, partition: 0, offset: 10, at: t0},
		{call: "b", version: 1, partition: 1, offset: 4, at: t0.Add(10 * time.Second)},
		{call: "a", version: 2, partition: 0, offset: 11, at: t0.Add(time.Minute)},
		{call: "c", version: 1, epoch: 1, partition: 0, offset: 0, at: t0.Add(2 * time.Minute)},
		{call: "a", version: 3, partition: 0, offset: 12, at: t0.Add(90 * time.Second)},
	}
	now := t0.Add(3 * time.Minute)
	for _, c := range []struct {
		epoch int
		p     int32
		from  int64
		want  time.Duration
	}{
		{0, 0, 10, 3 * time.Minute},
		{0, 0, 11, 2 * time.Minute},
		{0, 0, 13, 0}, // nothing sent at or past it
		{1, 0, 0, time.Minute},
		{0, 1, 0, 170 * time.Second},
	} {
		if got := oldestWait(ledger, c.epoch, c.p, c.from, now); got != c.want {
			t.Errorf("oldestWait(epoch %d, partition %d, from %d) = %v, want %v", c.epoch, c.p, c.from, got, c.want)
		}
	}
}
