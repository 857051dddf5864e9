package main

import (
	"fmt"
	"strings"
	"time"
)

// outcome is what a run found: everything its verdict weighs, gathered by
// run so that verdict itself is a pure function of it (and testable).
type outcome struct {
	sent       int // transcripts the broker acknowledged
	t          tally
	removals   []removal
	counts     map[string]int // faults injected, by kind
	replays    int            // crash-like faults (see soak.replays)
	behind     string         // partitions not caught up after opt.catchUp; "" = none
	caughtUpIn time.Duration
	backlog    int64 // input not committed when the faults stopped; -1 = unknown
	stall      stalls
	exits      map[string][]string // unasked exits, by scorer name
	termErrors []string            // SIGTERM exits that were not 0 within the wait
	base, last sample              // scorer A after the warm-up and after the catch-up
	peak       sample
	scrapeErr  error // A's last scrape failed
	logs       map[string]int
}

// verdict is the run's one line and the bounds it broke (none: PASS).
func verdict(opt options, o outcome) (string, []string) {
	t := o.t
	var broken []string
	if o.behind != "" {
		broken = append(broken, "not caught up after "+opt.catchUp.String()+": "+o.behind)
	}
	if t.lost > 0 {
		broken = append(broken, fmt.Sprintf("lost %d: %s", t.lost, strings.Join(t.lostCalls, "; ")))
	}
	if t.skipped > 0 {
		broken = append(broken, fmt.Sprintf("older versions skipped %d: %s", t.skipped, strings.Join(t.skippedCalls, "; ")))
	}
	if t.outOfOrder > 0 {
		broken = append(broken, fmt.Sprintf("out of order %d: %s", t.outOfOrder, strings.Join(t.oooCalls, "; ")))
	}
	if t.phantom > 0 {
		broken = append(broken, fmt.Sprintf("%d outputs of versions never sent", t.phantom))
	}
	dupBound := opt.maxUncommit * opt.partitions * o.replays
	if t.duplicates > dupBound {
		broken = append(broken, fmt.Sprintf("duplicates %d over the bound %d", t.duplicates, dupBound))
	}
	if t.validDLQ > 0 {
		broken = append(broken, fmt.Sprintf("valid transcripts dead-lettered %d (bound 0: the soak sends none the scorer may reject): %s",
			t.validDLQ, strings.Join(t.validDLQCalls, "; ")))
	}
	// Every member, not only A: B is killed only by SIGKILL and C and D
	// only leave by SIGTERM, each asked for; an exit nobody asked for is a
	// crash, whichever member it hit.
	for _, name := range sortedKeys(o.exits) {
		if e := o.exits[name]; len(e) > 0 {
			broken = append(broken, fmt.Sprintf("scorer %s exited by itself: %s", name, strings.Join(e, ", ")))
		}
	}
	if len(o.termErrors) > 0 {
		broken = append(broken, "SIGTERM exits not clean: "+strings.Join(o.termErrors, "; "))
	}
	// The catch-up time is what the group is given to reach the end once
	// the faults stop; a partition whose commit stood still that long while
	// it had records to read, or whose oldest record waited that long
	// unread, was stuck, not slowed by a fault, and a topic deletion or
	// truncation that then took its records away does not excuse them.
	if o.stall.longest > opt.catchUp {
		broken = append(broken, fmt.Sprintf("commit stalled %v (bound %v, the catch-up time): %s",
			o.stall.longest.Round(time.Second), opt.catchUp, o.stall.where))
	}
	var removedWait time.Duration
	for _, r := range o.removals {
		removedWait = max(removedWait, r.waited)
		if r.waited > opt.catchUp {
			broken = append(broken, fmt.Sprintf("partition %d epoch %d [%d,%d) excused as %s after its oldest record waited %v unread (bound %v, the catch-up time)",
				r.partition, r.epoch, r.from, r.to, r.why, r.waited.Round(time.Second), opt.catchUp))
		}
	}
	rssDrift, gDrift := (o.last.rss-o.base.rss)/(1<<20), o.last.goroutines-o.base.goroutines
	switch {
	case o.scrapeErr != nil:
		broken = append(broken, "scorer A's metrics at the end: "+o.scrapeErr.Error())
	case rssDrift > opt.maxRSSDrift:
		broken = append(broken, fmt.Sprintf("scorer A's RSS grew %.1f MiB (bound %v)", rssDrift, opt.maxRSSDrift))
	case gDrift > opt.maxGoroutines:
		broken = append(broken, fmt.Sprintf("scorer A's goroutines grew %v (bound %v)", gDrift, opt.maxGoroutines))
	}
	nExits := 0
	for _, e := range o.exits {
		nExits += len(e)
	}

	v := "PASS"
	if len(broken) > 0 {
		v = "FAIL"
	}
	line := fmt.Sprintf("soak %s: seed=%d minutes=%v sent=%d (calls %d, poison %d) faults=%d [%s] lost=%d skipped_older_versions=%d removed_by_faults=%d [%s] removed_oldest_wait=%v "+
		"out_of_order=%d duplicates=%d (bound %d = MAX_UNCOMMITTED %d × %d partitions × %d crash-like faults) stale_last=%d poison_dead_lettered=%d/%d (%d removed) valid_dead_lettered=%d dlq=%s "+
		"A_rss=%.1f→%.1f MiB (drift %+.1f, peak %.1f) A_goroutines=%v→%v (drift %+v, peak %v) backlog_at_end_of_faults=%d caught_up_in=%v longest_commit_stall=%v (%s) unasked_exits=%d sigterm_unclean=%d "+
		"scorer_logs: generations=%d commit_failures=%d failed_generations=%d",
		v, opt.seed, opt.minutes, o.sent, t.calls, t.poison, sum(o.counts), kv(o.counts), t.lost, t.skipped, sum(t.removed), kv(t.removed), removedWait.Round(time.Second),
		t.outOfOrder, t.duplicates, dupBound, opt.maxUncommit, opt.partitions, o.replays, t.staleLast, t.poisonDLQ, t.poison, t.poisonRemoved, t.validDLQ, dlqSummary(t),
		o.base.rss/(1<<20), o.last.rss/(1<<20), rssDrift, o.peak.rss/(1<<20), o.base.goroutines, o.last.goroutines, gDrift, o.peak.goroutines,
		o.backlog, o.caughtUpIn.Round(100*time.Millisecond), o.stall.longest.Round(time.Second), cmpOr(o.stall.where, "none"), nExits, len(o.termErrors),
		o.logs["generation started"], o.logs["commit failed"], o.logs["consumer group generation failed"])
	return line, broken
}
