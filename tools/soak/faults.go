package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"syscall"
	"time"
)

// fault is one kind of trouble the soak injects; weight is how often it is
// drawn relative to the others.
type fault struct {
	name   string
	weight int
	// regroups: the fault makes the group rebalance (a member dies, joins
	// or leaves, or loses its connections). The next fault then usually
	// waits until the group could have formed again; see nextGap.
	regroups bool
	do       func(ctx context.Context, s *soak, rng *rand.Rand) (string, error)
}

// nextGap is the pause before the next fault. After a fault that makes the
// group rebalance it is usually 10–20 s: a session timeout (10 s) for a dead
// member to be dropped, and the rebalance. Without it the storm keeps the
// group from ever forming (seen: kfake restarts its rebalance deadline at
// each membership change, and with a kill, cut or join every few seconds the
// group stayed in PreparingRebalance for the whole six-minute run, 24
// members and none assigned, so nothing was scored until the faults
// stopped). One time in four the gap is 1–4 s anyway, so faults still land
// on a rebalance in progress; after other faults it is 1–4 s.
func nextGap(rng *rand.Rand, after fault) time.Duration {
	if after.regroups && rng.IntN(4) != 0 {
		return time.Duration(10000+rng.IntN(10000)) * time.Millisecond
	}
	return time.Duration(1000+rng.IntN(3000)) * time.Millisecond
}

// faults are run one at a time, so each is healed (a pause resumed, a
// refused commit accepted again) before the next is drawn, and the figures
// say which fault an anomaly followed.
var faults = []fault{
	{"kill", 3, true, func(_ context.Context, s *soak, rng *rand.Rand) (string, error) {
		b := s.scorers[1]
		if !b.running() {
			return "B was down; started", b.start()
		}
		_ = b.stop(syscall.SIGKILL, 10*time.Second) // its exit is "signal: killed"
		down := time.Duration(500+rng.IntN(3000)) * time.Millisecond
		time.Sleep(down)
		s.replays++
		return fmt.Sprintf("SIGKILL B, restarted after %v", down.Round(time.Millisecond)), b.start()
	}},
	{"join", 2, true, func(_ context.Context, s *soak, rng *rand.Rand) (string, error) {
		for _, j := range s.scorers[2:] {
			if !j.running() {
				s.replays++
				return "started " + j.name, j.start()
			}
		}
		return "", errSkip
	}},
	{"leave", 2, true, func(_ context.Context, s *soak, rng *rand.Rand) (string, error) {
		for _, j := range s.scorers[2:] {
			if j.running() {
				s.replays++
				if err := j.stop(syscall.SIGTERM, 40*time.Second); err != nil {
					s.termErrors = append(s.termErrors, fmt.Sprintf("%s: %v", j.name, err))
					return "SIGTERM " + j.name + ": " + err.Error(), nil
				}
				return "SIGTERM " + j.name + ": exit 0", nil
			}
		}
		return "", errSkip
	}},
	{"broker-restart", 1, true, func(_ context.Context, s *soak, rng *rand.Rand) (string, error) {
		down := time.Duration(rng.IntN(3000)) * time.Millisecond
		s.replays++
		return fmt.Sprintf("down %v", down.Round(time.Millisecond)), s.cl.restart(down)
	}},
	{"commit-refused", 2, false, func(ctx context.Context, s *soak, rng *rand.Rand) (string, error) {
		d := time.Duration(3000+rng.IntN(12000)) * time.Millisecond
		heal := s.cl.refuseCommits()
		sleep(ctx, d)
		heal()
		return fmt.Sprintf("every OffsetCommit answered COORDINATOR_LOAD_IN_PROGRESS for %v", d.Round(time.Millisecond)), nil
	}},
	{"truncate", 1, false, func(ctx context.Context, s *soak, rng *rand.Rand) (string, error) {
		return s.truncate(ctx, rng)
	}},
	{"topic-recreate", 1, true, func(ctx context.Context, s *soak, rng *rand.Rand) (string, error) {
		return s.recreate(ctx, rng)
	}},
	{"delay", 2, false, func(ctx context.Context, s *soak, rng *rand.Rand) (string, error) {
		d := time.Duration(20+rng.IntN(280)) * time.Millisecond
		span := time.Duration(2000+rng.IntN(8000)) * time.Millisecond
		s.cl.px.SetDelay(d)
		sleep(ctx, span)
		s.cl.px.SetDelay(0)
		return fmt.Sprintf("%v per chunk for %v", d, span.Round(time.Millisecond)), nil
	}},
	{"cut", 2, true, func(_ context.Context, s *soak, rng *rand.Rand) (string, error) {
		s.replays++
		return fmt.Sprintf("%d connections reset", s.cl.px.Cut()), nil
	}},
	{"freeze", 1, true, func(ctx context.Context, s *soak, rng *rand.Rand) (string, error) {
		// Up to 15 s: past the 10 s session timeout sometimes, so the
		// group may expel every member and re-form after it.
		span := time.Duration(2000+rng.IntN(13000)) * time.Millisecond
		s.replays++
		s.cl.px.Pause()
		sleep(ctx, span)
		s.cl.px.Resume()
		return fmt.Sprintf("every connection frozen for %v", span.Round(time.Millisecond)), nil
	}},
	{"poison", 2, false, func(ctx context.Context, s *soak, rng *rand.Rand) (string, error) {
		pctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		err := s.prod.poison(pctx)
		return "one malformed JSON record: " + s.prod.lastPoison, err
	}},
}

// truncate moves a partition's log start (DeleteRecords) to a random point
// between the group's commit and the end, so records not read yet may go:
// those are counted as removed, not lost.
func (s *soak) truncate(ctx context.Context, rng *rand.Rand) (string, error) {
	s.prod.mu.Lock() // the epoch must not change under the removal's record
	defer s.prod.mu.Unlock()
	p := int32(rng.IntN(s.cl.partitions))
	committed, err := retry(ctx, s.cl.committed)
	if err != nil {
		return "", err
	}
	o, err := retry(ctx, func(ctx context.Context) (offsets, error) { return s.cl.offsets(ctx, inputTopic) })
	if err != nil {
		return "", err
	}
	from := max(committed[p], o.start[p])
	if o.end[p] <= from {
		return "", errSkip // nothing unread there
	}
	to := from + 1 + rng.Int64N(o.end[p]-from)
	if err := s.cl.kfake().DeleteRecords(inputTopic, p, to); err != nil {
		return "", err
	}
	s.removals = append(s.removals, removal{why: "truncated", epoch: s.prod.epoch, partition: p, from: from, to: to,
		waited: oldestWait(s.prod.ledger, s.prod.epoch, p, from, time.Now())})
	return fmt.Sprintf("partition %d log start %d -> %d (committed %d, end %d)", p, o.start[p], to, committed[p], o.end[p]), nil
}

// recreate deletes the input topic and creates it again (kfake drops the
// group's commits of it, as Kafka does): whatever was not committed is gone.
func (s *soak) recreate(ctx context.Context, rng *rand.Rand) (string, error) {
	s.prod.mu.Lock() // no produce between the delete and the create
	defer s.prod.mu.Unlock()
	committed, err := retry(ctx, s.cl.committed)
	if err != nil {
		return "", err
	}
	o, err := retry(ctx, func(ctx context.Context) (offsets, error) { return s.cl.offsets(ctx, inputTopic) })
	if err != nil {
		return "", err
	}
	var spans []string
	for p := range int32(s.cl.partitions) {
		from := max(committed[p], o.start[p])
		spans = append(spans, fmt.Sprintf("%d:[%d,%d)", p, from, o.end[p]))
		if o.end[p] > from {
			s.removals = append(s.removals, removal{why: "topic-deleted", epoch: s.prod.epoch, partition: p, from: from, to: o.end[p],
				waited: oldestWait(s.prod.ledger, s.prod.epoch, p, from, time.Now())})
		}
	}
	if err := s.cl.kfake().DeleteTopic(inputTopic); err != nil {
		return "", err
	}
	gap := time.Duration(rng.IntN(2000)) * time.Millisecond
	time.Sleep(gap)
	if err := s.cl.kfake().CreateTopic(inputTopic, int32(s.cl.partitions), nil); err != nil {
		return "", err
	}
	s.prod.epoch++
	// franz-go's producer keeps the deleted topic's ID and has every later
	// send answered UNKNOWN_TOPIC_ID (seen with v1.22.2 on kfake): the
	// soak's own producer starts afresh, as a restarted producer would.
	if err := s.prod.reconnect(); err != nil {
		return "", err
	}
	return fmt.Sprintf("epoch %d deleted with unread spans %s, re-created after %v", s.prod.epoch-1, strings.Join(spans, " "), gap.Round(time.Millisecond)), nil
}

func sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-time.After(d):
	}
}
