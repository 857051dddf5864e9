package main

import (
	"context"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/scorer/scorer/internal/faultproxy"
)

const (
	inputTopic  = "transcripts"
	outputTopic = "transcripts.scored"
	dlqTopic    = "transcripts.dlq"
	group       = "soak"
)

// bigTopic is the output and DLQ topics' max.message.bytes: what `scorer
// broker` gives them, so the scorer's start-up check of its output sizes
// passes (kfake's default is about 1 MiB).
var bigTopic = map[string]string{"max.message.bytes": strconv.Itoa(128 << 20)}

// cluster is kfake persisting to dir behind a faultproxy. The broker
// advertises the proxy's address (faultproxy.AdvertiseAs), so every client,
// the scorers and the soak's own, reaches it only through the proxy, and a
// restart (Close, then a new cluster on the same dir) is invisible to
// clients but as the outage it is: the proxy's address never changes.
type cluster struct {
	dir        string
	partitions int
	px         *faultproxy.Proxy
	admin      *kafka.Client

	mu sync.Mutex
	c  *kfake.Cluster
}

func startCluster(dir string, partitions int) (*cluster, error) {
	px, err := faultproxy.Listen("127.0.0.1:0", "")
	if err != nil {
		return nil, err
	}
	cl := &cluster{dir: dir, partitions: partitions, px: px,
		admin: &kafka.Client{Addr: kafka.TCP(px.Addr()), Timeout: 10 * time.Second}}
	if err := cl.start(); err != nil {
		px.Close()
		return nil, err
	}
	for _, t := range []struct {
		name  string
		parts int
		cfg   map[string]string
	}{{inputTopic, partitions, nil}, {outputTopic, partitions, bigTopic}, {dlqTopic, 1, bigTopic}} {
		if err := cl.kfake().CreateTopic(t.name, int32(t.parts), t.cfg); err != nil {
			cl.close()
			return nil, fmt.Errorf("create %s: %w", t.name, err)
		}
	}
	return cl, nil
}

func (cl *cluster) start() error {
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.DataDir(cl.dir),
		kfake.DefaultNumPartitions(cl.partitions),
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(128 << 20)}),
		kfake.ListenFn(func(network, _ string) (net.Listener, error) {
			ln, err := net.Listen(network, "127.0.0.1:0")
			if err != nil {
				return nil, err
			}
			cl.px.SetTarget(ln.Addr().String())
			return faultproxy.AdvertiseAs(ln, cl.px.Addr()), nil
		}))
	if err != nil {
		return err
	}
	cl.mu.Lock()
	cl.c = c
	cl.mu.Unlock()
	return nil
}

func (cl *cluster) kfake() *kfake.Cluster {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.c
}

// restart stops the broker (clients see refused connections and resets,
// as when a broker process dies) and starts it again on the same data after
// down.
func (cl *cluster) restart(down time.Duration) error {
	cl.px.Refuse(true)
	cl.px.Cut()
	cl.kfake().Close()
	time.Sleep(down)
	err := cl.start()
	cl.px.Refuse(false)
	return err
}

// refuseCommits answers every OffsetCommit with a retriable coordinator
// error until the returned function is called; heartbeats, fetches and
// produces go on, so the scorer keeps working past its last commit (up to
// MAX_UNCOMMITTED per partition).
func (cl *cluster) refuseCommits() func() {
	h := cl.kfake().Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.OffsetCommit}, Err: kerr.CoordinatorLoadInProgress, Count: -1})
	return h.Remove
}

func (cl *cluster) close() {
	if c := cl.kfake(); c != nil {
		c.Close()
	}
	cl.px.Close()
}

// offsets is each partition's log start and high watermark.
type offsets struct{ start, end map[int32]int64 }

func (cl *cluster) offsets(ctx context.Context, topic string) (offsets, error) {
	parts := cl.partitions
	if topic == dlqTopic {
		parts = 1
	}
	reqs := make([]kafka.OffsetRequest, 0, 2*parts)
	for p := range parts {
		reqs = append(reqs, kafka.FirstOffsetOf(p), kafka.LastOffsetOf(p))
	}
	resp, err := cl.admin.ListOffsets(ctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{topic: reqs}})
	if err != nil {
		return offsets{}, err
	}
	o := offsets{start: map[int32]int64{}, end: map[int32]int64{}}
	for _, po := range resp.Topics[topic] {
		if po.Error != nil {
			return offsets{}, fmt.Errorf("list offsets %s/%d: %w", topic, po.Partition, po.Error)
		}
		o.start[int32(po.Partition)] = po.FirstOffset
		o.end[int32(po.Partition)] = po.LastOffset
	}
	if len(o.end) != parts {
		return offsets{}, fmt.Errorf("list offsets %s: %d of %d partitions", topic, len(o.end), parts)
	}
	return o, nil
}

// committed is the group's committed offset per input partition (-1 where
// none).
func (cl *cluster) committed(ctx context.Context) (map[int32]int64, error) {
	parts := make([]int, cl.partitions)
	for p := range parts {
		parts[p] = p
	}
	resp, err := cl.admin.OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{inputTopic: parts}})
	if err != nil {
		return nil, err
	}
	if resp.Error != nil {
		return nil, resp.Error
	}
	out := map[int32]int64{}
	for p := range parts {
		out[int32(p)] = -1
	}
	for _, p := range resp.Topics[inputTopic] {
		if p.Error != nil {
			return nil, fmt.Errorf("offset fetch %s/%d: %w", inputTopic, p.Partition, p.Error)
		}
		out[int32(p.Partition)] = p.CommittedOffset
	}
	return out, nil
}

// retry runs f until it succeeds or ctx ends: the admin reads go through
// the proxy and the broker, either of which a fault may have just reset.
func retry[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	for {
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		v, err := f(actx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return v, err
		}
		select {
		case <-ctx.Done():
			return v, err
		case <-time.After(300 * time.Millisecond):
		}
	}
}
