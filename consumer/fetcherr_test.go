package consumer

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// rawBatches fetches partition 0 of topic from offset 0 as the broker
// stores it: the record batches' bytes, undecoded.
func rawBatches(t *testing.T, cluster *kfake.Cluster, topic string) []byte {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrFetchRequest()
	req.MaxWaitMillis, req.MaxBytes = 100, 1<<20
	rt := kmsg.NewFetchRequestTopic()
	rt.Topic, rt.TopicID = topic, cluster.TopicInfo(topic).TopicID
	rp := kmsg.NewFetchRequestTopicPartition()
	rp.Partition, rp.FetchOffset, rp.PartitionMaxBytes = 0, 0, 1<<20
	rt.Partitions = append(rt.Partitions, rp)
	req.Topics = append(req.Topics, rt)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		t.Fatal(err)
	}
	p := resp.Topics[0].Partitions[0]
	if err := kerr.ErrorForCode(p.ErrorCode); err != nil {
		t.Fatalf("set-up: raw fetch: %v", err)
	}
	return p.RecordBatches
}

// splitBatches cuts raw record batches at their length fields.
func splitBatches(t *testing.T, raw []byte) [][]byte {
	t.Helper()
	var out [][]byte
	for len(raw) > 0 {
		var b kmsg.RecordBatch
		if err := b.ReadFrom(raw); err != nil {
			t.Fatalf("set-up: batch: %v", err)
		}
		n := 12 + int(b.Length)
		out = append(out, raw[:n:n])
		raw = raw[n:]
	}
	return out
}

// TestFetchErrorKeepsRecordsBefore: the first fetch of the partition
// answers a valid batch (good-0..4) followed by one whose CRC does not
// match (bad-0..4, as a broker with a corrupt segment would). franz-go
// returns the good batch's records together with the CRC error and reads on
// from the bad batch, so those records must be scored, not dropped with the
// error: dropping them left the commit to move past them.
func TestFetchErrorKeepsRecordsBefore(t *testing.T) {
	t.Parallel()
	const topic, group = "corrupt", "g-corrupt"
	cluster, brokers := newCluster(t, topic, 1)
	produce(t, brokers, topic, msgsFor(0, callIDs("good", 5)))
	produce(t, brokers, topic, msgsFor(0, callIDs("bad", 5)))
	batches := splitBatches(t, rawBatches(t, cluster, topic))
	if len(batches) != 2 {
		t.Fatalf("set-up: %d batches, want 2 (one per produce)", len(batches))
	}
	corrupt := slices.Clone(batches[1])
	corrupt[17] ^= 0xff // the CRC's first byte (offset 8, length 4, leader epoch 4, magic 1)
	body := append(slices.Clone(batches[0]), corrupt...)
	id := cluster.TopicInfo(topic).TopicID

	var served atomic.Bool
	cluster.ControlKey(kmsg.Fetch.Int16(), func(kreq kmsg.Request) (kmsg.Response, error, bool) {
		cluster.KeepControl()
		req := kreq.(*kmsg.FetchRequest)
		for _, rt := range req.Topics {
			for _, rp := range rt.Partitions {
				if (rt.Topic != topic && rt.TopicID != id) || rp.FetchOffset != 0 || !served.CompareAndSwap(false, true) {
					continue
				}
				resp := req.ResponseKind().(*kmsg.FetchResponse)
				st := kmsg.NewFetchResponseTopic()
				st.Topic, st.TopicID = topic, id
				sp := kmsg.NewFetchResponseTopicPartition()
				sp.HighWatermark, sp.LastStableOffset, sp.LogStartOffset = 10, 10, 0
				sp.RecordBatches = body
				st.Partitions = append(st.Partitions, sp)
				resp.Topics = append(resp.Topics, st)
				return resp, nil, true
			}
		}
		return nil, nil, false
	})

	sk := &fakeSink{}
	start(t, testConfig(brokers, topic, group), &fakeScorer{}, sk, testHooks{})
	eventually(t, 20*time.Second, "the batch after the corrupt one published and committed", func() bool {
		return countIDs(sk.Published())["bad-4"] == 1 && committed(t, brokers, group, topic, 1)[0] == 10
	})
	if !served.Load() {
		t.Fatal("set-up: the corrupt fetch answer was never served")
	}
	n := countIDs(sk.Published())
	for _, id := range callIDs("good", 5) {
		if n[id] != 1 {
			t.Errorf("%s published %d times, want 1: the records delivered with the fetch error were dropped, and offset 10 committed past them", id, n[id])
		}
	}
}
