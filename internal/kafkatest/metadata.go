package kafkatest

import (
	"errors"
	"testing"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
)

// Replicas is the replica count of each partition of topic, as the
// cluster at addrs lists them in its metadata; none when the topic does not
// exist. Any other metadata error fails the test.
func Replicas(t testing.TB, addrs []string, topic string) []int {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	req := kmsg.NewPtrMetadataRequest()
	rt := kmsg.NewMetadataRequestTopic()
	rt.Topic = kmsg.StringPtr(topic)
	req.Topics = append(req.Topics, rt)
	resp, err := req.RequestWith(t.Context(), cl)
	if err != nil {
		t.Fatal(err)
	}
	var out []int
	for _, mt := range resp.Topics {
		if mt.Topic == nil || *mt.Topic != topic {
			continue
		}
		if err := kerr.ErrorForCode(mt.ErrorCode); errors.Is(err, kerr.UnknownTopicOrPartition) {
			return nil
		} else if err != nil {
			t.Fatalf("metadata of %s: %v", topic, err)
		}
		for _, p := range mt.Partitions {
			out = append(out, len(p.Replicas))
		}
	}
	return out
}
