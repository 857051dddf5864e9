package main

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// TestReliabilityRebalance: three scorer processes in one group on a
// six-partition input while members leave (SIGTERM) and join (a new
// process) three times as work flows. Nothing is lost, every member that
// leaves exits 0, and the group's commits reach the end of every
// partition. (That a member never commits a partition it no longer owns is
// asserted at unit level with kfake's ControlKey in consumer/rebalance_test.go;
// here a wrong commit would show as a gap or a stuck offset.)
func TestReliabilityRebalance(t *testing.T) {
	if testing.Short() {
		t.Skip("three scorer processes, three rebalances")
	}
	// Each round waits for 250 new outputs and then for one member's drain,
	// while the others go on scoring for as long as the drain, exit and join
	// take: a timed share, larger the faster the machine. The three rounds
	// took 846 to 1 104 outputs on two loaded cores, so 2 500 inputs (it was
	// 3 000) leave the last join a rebalance with work still to move on a
	// quiet or faster machine too, and the guard below fails the drill if not.
	const (
		n     = 2500
		group = "rebalance-drill"
	)
	start := time.Now()
	broker := startBrokerProcess(t, 6)
	ids := produceSmallEvents(t, broker, n, "REBAL")
	out := watchTopic(t, broker, "transcripts.scored", nil)
	env := relEnv(t, "KAFKA_BROKERS", broker, "KAFKA_GROUP_ID", group, "LABELS", "consumer weakness", "CPU_THREADS", "1")

	var members []*scorerProcess
	for range 3 {
		members = append(members, startScorerProcess(t, env))
	}
	for round := 1; round <= 3; round++ {
		before := out.len()
		waitUntil(t, 3*time.Minute, fmt.Sprintf("round %d: 250 new outputs", round), func() bool { return out.len() >= before+250 },
			func() string { return fmt.Sprintf("%d outputs", out.len()) })
		leaving := members[0]
		members = members[1:]
		took, err := signalAndWait(t, leaving, syscall.SIGTERM, 40*time.Second)
		if err != nil {
			t.Errorf("round %d: member exited with %v after SIGTERM", round, err)
		}
		members = append(members, startScorerProcess(t, env))
		t.Logf("round %d at %v: one member left (exit after %v), one joined; %d outputs so far",
			round, time.Since(start).Round(time.Second), took.Round(time.Millisecond), out.len())
		if out.distinctKeys() >= n {
			t.Fatalf("all %d transcripts were scored by round %d: the drill must rebalance mid-stream (grow n)", n, round)
		}
	}
	out.waitKeys(t, n, 5*time.Minute)
	waitCommittedToEnd(t, broker, group, "transcripts", time.Minute)
	for _, m := range members {
		if _, err := signalAndWait(t, m, syscall.SIGTERM, 40*time.Second); err != nil {
			t.Errorf("member exited with %v after SIGTERM", err)
		}
	}
	msgs, bySrc, _ := checkAllScored(t, broker, out, ids)
	dups := len(msgs) - len(bySrc)
	// Graceful leaves drain before they give partitions up, so redelivery
	// is rare; a handful is allowed (a drain that overran RevokeTimeout).
	if dups > 200 {
		t.Errorf("%d duplicates after graceful rebalances", dups)
	}
	t.Logf("rebalance drill: %d inputs, %d outputs, %d duplicates, 3 leaves + 3 joins, %v", n, len(msgs), dups, time.Since(start).Round(time.Second))
}
