package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// TestClusterLeaderKillAndRejoin needs Apache Kafka, not kfake: a leader elected again after its
// broker is SIGKILLed, and the restarted broker back in the ISR, happen only on a real cluster.
func TestClusterLeaderKillAndRejoin(t *testing.T) {
	c := StartCluster(t, 3)
	ctx, cancel := context.WithTimeout(t.Context(), 90*time.Second)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.Bootstrap()...), kgo.RequiredAcks(kgo.AllISRAcks()),
		kgo.ConsumeTopics("t"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrCreateTopicsRequest()
	rt := kmsg.NewCreateTopicsRequestTopic()
	rt.Topic, rt.NumPartitions, rt.ReplicationFactor = "t", 1, 3
	req.Topics = append(req.Topics, rt)
	req.TimeoutMillis = 30000
	resp, err := req.RequestWith(ctx, cl)
	if err != nil || kerr.ErrorForCode(resp.Topics[0].ErrorCode) != nil {
		t.Fatalf("creating t: %v %v", err, resp)
	}
	// A broker other than the controller learns of the topic a moment
	// later (on a loaded machine, seconds): its metadata lists no
	// partitions until then.
	for {
		got := Replicas(t, c.Bootstrap(), "t")
		if len(got) == 1 && got[0] == 3 {
			break
		}
		if len(got) != 0 || ctx.Err() != nil {
			t.Fatalf("replicas of t: %v, want [3]", got)
		}
		time.Sleep(200 * time.Millisecond)
	}
	produce := func(v string) {
		t.Helper()
		if err := cl.ProduceSync(ctx, &kgo.Record{Topic: "t", Value: []byte(v)}).FirstErr(); err != nil {
			t.Fatalf("producing %s: %v", v, err)
		}
	}
	produce("a")
	leader, _ := partition(t, ctx, cl)
	c.Kill(int(leader))
	produce("b")
	if l, _ := partition(t, ctx, cl); l == leader {
		t.Fatalf("leader is still %d after its SIGKILL", l)
	}
	var got []string
	for len(got) < 2 && ctx.Err() == nil {
		cl.PollFetches(ctx).EachRecord(func(r *kgo.Record) { got = append(got, string(r.Value)) })
	}
	if len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("consumed %q, want [a b]", got)
	}
	c.Start(int(leader))
	for {
		if _, isr := partition(t, ctx, cl); len(isr) == 3 {
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("node %d did not rejoin t's ISR", leader)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// partition is partition 0 of t's leader and ISR as the cluster's metadata lists them.
func partition(t *testing.T, ctx context.Context, cl *kgo.Client) (int32, []int32) {
	t.Helper()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr("t")
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(ctx, cl)
	if err != nil || len(resp.Topics) != 1 || len(resp.Topics[0].Partitions) != 1 {
		t.Fatalf("metadata of t: %v %v", err, resp)
	}
	p := resp.Topics[0].Partitions[0]
	return p.Leader, p.ISR
}
