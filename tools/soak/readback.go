package main

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/scorer/scorer/schema"
)

// readBack reads the output topic and the DLQ from their starts to their
// ends.
func (s *soak) readBack(ctx context.Context) ([]published, []deadLetter, error) {
	ends := map[string]map[int32]int64{}
	for _, topic := range []string{outputTopic, dlqTopic} {
		o, err := retry(ctx, func(ctx context.Context) (offsets, error) { return s.cl.offsets(ctx, topic) })
		if err != nil {
			return nil, nil, err
		}
		ends[topic] = o.end
	}
	parts := map[string]map[int32]kgo.Offset{}
	for topic, e := range ends {
		parts[topic] = map[int32]kgo.Offset{}
		for p := range e {
			parts[topic][p] = kgo.NewOffset().AtStart()
		}
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(s.cl.px.Addr()), kgo.ConsumePartitions(parts), kgo.FetchMaxBytes(64<<20))
	if err != nil {
		return nil, nil, err
	}
	defer cl.Close()
	next := map[string]map[int32]int64{outputTopic: {}, dlqTopic: {}}
	done := func() bool {
		for topic, e := range ends {
			for p, end := range e {
				if next[topic][p] < end {
					return false
				}
			}
		}
		return true
	}
	var outs []published
	var dlq []deadLetter
	rctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	for !done() {
		fs := cl.PollFetches(rctx)
		if rctx.Err() != nil {
			return nil, nil, fmt.Errorf("read back: %w (read up to %v, ends %v)", rctx.Err(), next, ends)
		}
		var ferr error
		fs.EachError(func(topic string, p int32, err error) { ferr = fmt.Errorf("%s/%d: %w", topic, p, err) })
		if ferr != nil {
			return nil, nil, ferr
		}
		fs.EachRecord(func(r *kgo.Record) {
			next[r.Topic][r.Partition] = r.Offset + 1
			switch r.Topic {
			case outputTopic:
				var st schema.ScoredTranscript
				if err := json.Unmarshal(r.Value, &st); err != nil {
					ferr = fmt.Errorf("output %d/%d: %w", r.Partition, r.Offset, err)
					return
				}
				v, _ := strconv.Atoi(st.VersionID)
				outs = append(outs, published{call: st.CallID, version: v, partition: r.Partition, offset: r.Offset})
			case dlqTopic:
				d := deadLetter{call: string(r.Key)}
				for _, h := range r.Headers {
					if h.Key == schema.HeaderDLQReason {
						d.reason = string(h.Value)
					}
				}
				var ev struct {
					VersionID string `json:"version_id"`
				}
				if json.Unmarshal(r.Value, &ev) == nil {
					d.version, _ = strconv.Atoi(ev.VersionID)
				} else {
					d.version = 1 // a poison record: its one version
				}
				dlq = append(dlq, d)
			}
		})
		if ferr != nil {
			return nil, nil, ferr
		}
	}
	return outs, dlq, nil
}
