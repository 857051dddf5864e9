package producer

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/segmentio/kafka-go"
	metadataAPI "github.com/segmentio/kafka-go/protocol/metadata"
)

// errNotSent is the error of records that were not sent because an earlier
// request of their partition failed: sending them would write them before
// the records that failed, out of order. They are retried with those.
var errNotSent = errors.New("producer: not sent, an earlier request of the partition failed")

// requestWriter writes records with kafka-go's lower-level Client.Produce,
// one request per partition chunk, and nothing else: no queue, no
// background retries, no linger. When ctx ends, the call returns and
// nothing more of it is sent; at most the requests already on the wire
// (one per partition) may still land. kafka.Writer cannot promise that:
// its WriteMessages returns on ctx end but leaves the batch queued and
// retried for MaxAttempts, and Close flushes it, so work abandoned at a
// revocation or the shutdown deadline was written anyway. Retries are the
// Producer's (write), with backoff, and stop with ctx.
//
// Records of one partition are sent in order, one request at a time, and
// a failed request stops that partition's later requests (errNotSent), so
// a retry never writes a record before the ones in front of it. Records
// resent alone after a whole-request rejection go through the same
// partition loop as the rest, so that rule covers them too.
type requestWriter struct {
	client      *kafka.Client
	balancer    kafka.Balancer
	compression kafka.Compression
	batchSize   int   // records per request
	batchBytes  int64 // bytes per request (recordSize), unless one record is larger
	// recordLimit is the largest record (recordSize) of a topic; a request
	// never holds more than that either.
	recordLimit func(topic string) int64
	autoCreate  bool
}

// partKey names one partition of one topic.
type partKey struct {
	topic     string
	partition int
}

// writeMessages writes msgs and returns nil when every one was
// acknowledged, a kafka.WriteErrors with one entry per message when some
// failed, kafka.MessageTooLargeError (nothing sent) when a record alone is
// over batchBytes, or another error (metadata, ctx) when nothing was sent.
// A message whose alone entry is true (alone may be nil) is sent in a
// request of its own, so the broker's answer to it is about it alone.
func (w *requestWriter) writeMessages(ctx context.Context, msgs []kafka.Message, alone []bool) error {
	for _, m := range msgs {
		if recordSize(m) > w.recordLimit(m.Topic) {
			return kafka.MessageTooLargeError{Message: m}
		}
	}
	counts := map[string]int{}
	var order []partKey
	groups := map[partKey][]int{}
	for i, m := range msgs {
		n, ok := counts[m.Topic]
		if !ok {
			var err error
			if n, err = w.partitions(ctx, m.Topic); err != nil {
				return err
			}
			counts[m.Topic] = n
		}
		k := partKey{m.Topic, w.balancer.Balance(m, partitionIDs(n)...)}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], i)
	}
	errs := make(kafka.WriteErrors, len(msgs))
	var wg sync.WaitGroup
	for _, k := range order {
		wg.Go(func() { w.writePartition(ctx, k, msgs, alone, groups[k], errs) })
	}
	wg.Wait()
	for _, e := range errs {
		if e != nil {
			return errs
		}
	}
	return nil
}

// writePartition sends the messages idx of msgs to partition k in chunks of
// at most batchSize records and batchBytes bytes (or the topic's record
// limit, when smaller; a larger record goes alone), one request at a time,
// recording each message's error in errs. A message marked in alone is a
// chunk by itself. Each index belongs to one partition, so goroutines write
// disjoint entries of errs.
func (w *requestWriter) writePartition(ctx context.Context, k partKey, msgs []kafka.Message, alone []bool, idx []int, errs kafka.WriteErrors) {
	limit := min(w.batchBytes, w.recordLimit(k.topic))
	isAlone := func(i int) bool { return alone != nil && alone[i] }
	for len(idx) > 0 {
		n, size := 0, int64(0)
		for n < len(idx) && n < w.batchSize {
			s := recordSize(msgs[idx[n]])
			if n > 0 && (size+s > limit || isAlone(idx[n])) {
				break
			}
			size += s
			n++
			if isAlone(idx[n-1]) {
				break
			}
		}
		chunk := idx[:n]
		idx = idx[n:]
		records := make([]kafka.Record, len(chunk))
		for j, i := range chunk {
			m := msgs[i]
			records[j] = kafka.Record{Time: m.Time, Key: kafka.NewBytes(m.Key), Value: kafka.NewBytes(m.Value), Headers: m.Headers}
		}
		resp, err := w.client.Produce(ctx, &kafka.ProduceRequest{
			Topic: k.topic, Partition: k.partition, RequiredAcks: kafka.RequireAll,
			Compression: w.compression, Records: kafka.NewRecordReader(records...),
		})
		if err == nil && resp != nil && resp.Error != nil {
			err = resp.Error
		}
		if err == nil {
			continue
		}
		for j, i := range chunk {
			errs[i] = err
			if resp != nil {
				if re, ok := resp.RecordErrors[j]; ok {
					errs[i] = fmt.Errorf("%w (record: %v)", err, re)
				}
			}
		}
		for _, i := range idx {
			errs[i] = errNotSent
		}
		return
	}
}

// partitions returns the partition count of topic. The transport caches
// metadata (kafka.Transport's MetadataTTL), so this is normally no request.
func (w *requestWriter) partitions(ctx context.Context, topic string) (int, error) {
	r, err := w.client.Transport.RoundTrip(ctx, w.client.Addr, &metadataAPI.Request{
		TopicNames: []string{topic}, AllowAutoTopicCreation: w.autoCreate,
	})
	if err != nil {
		return 0, fmt.Errorf("producer: metadata of %s: %w", topic, err)
	}
	for _, t := range r.(*metadataAPI.Response).Topics {
		if t.Name != topic {
			continue
		}
		if t.ErrorCode != 0 {
			return 0, fmt.Errorf("producer: metadata of %s: %w", topic, kafka.Error(t.ErrorCode))
		}
		if len(t.Partitions) == 0 {
			break
		}
		return len(t.Partitions), nil
	}
	return 0, fmt.Errorf("producer: metadata of %s: %w", topic, kafka.UnknownTopicOrPartition)
}

func partitionIDs(n int) []int {
	ids := make([]int, n)
	for i := range ids {
		ids[i] = i
	}
	return ids
}
