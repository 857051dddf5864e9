package main

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// stalls watches, every 2 s, how long each input partition has had records
// to read with its commit not moving: the longest such wait is reported and
// bounded by the catch-up time (a fault that stops a group, like a freeze
// past the session timeout or a kill during a rebalance, makes a short one;
// a partition stuck for good makes a long one, which a later topic deletion
// would otherwise hide among removed records).
type stalls struct {
	longest time.Duration
	where   string
}

func (s *soak) watchStalls(ctx context.Context) *stalls {
	st := &stalls{}
	type state struct {
		committed int64
		since     time.Time
	}
	parts := map[int32]*state{}
	go func() {
		for ctx.Err() == nil {
			sleep(ctx, 2*time.Second)
			qctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			c, err := s.cl.committed(qctx)
			var o offsets
			if err == nil {
				o, err = s.cl.offsets(qctx, inputTopic)
			}
			cancel()
			if err != nil {
				continue // a fault in the way; the next look measures from the last good one
			}
			now := time.Now()
			s.mu.Lock()
			for p := range int32(s.cl.partitions) {
				ps := parts[p]
				if ps == nil || ps.committed != c[p] || max(c[p], o.start[p]) >= o.end[p] {
					parts[p] = &state{committed: c[p], since: now}
					continue
				}
				if d := now.Sub(ps.since); d > st.longest {
					st.longest = d
					st.where = fmt.Sprintf("partition %d from %.0fs", p, ps.since.Sub(s.start).Seconds())
				}
			}
			s.mu.Unlock()
		}
	}()
	return st
}

// behind is "" when every input partition's commit reached its end (or the
// log start is at its end: nothing is left to read), else what is behind.
func (s *soak) behind(ctx context.Context) string {
	c, err := s.cl.committed(ctx)
	if err != nil {
		return err.Error()
	}
	o, err := s.cl.offsets(ctx, inputTopic)
	if err != nil {
		return err.Error()
	}
	var out []string
	for p := range int32(s.cl.partitions) {
		if max(c[p], o.start[p]) < o.end[p] {
			out = append(out, fmt.Sprintf("%d: committed %d, end %d", p, c[p], o.end[p]))
		}
	}
	return strings.Join(out, "; ")
}

// waitFor polls cond every 500 ms until it holds, timeout passes or ctx
// ends.
func waitFor(ctx context.Context, timeout time.Duration, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("not within %v", timeout)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
	return nil
}
