package producer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"
)

// TopicSpec describes a topic EnsureTopics creates when it is missing.
type TopicSpec struct {
	Name string
	// Partitions defaults to 1.
	Partitions int
	// ReplicationFactor defaults to 1 (dev and the in-memory broker).
	ReplicationFactor int
	// Configs are topic configs such as max.message.bytes.
	Configs map[string]string
}

// EnsureTopicsAttemptTimeout bounds one EnsureTopics call when ctx has no
// earlier deadline: a broker that accepts TCP connections and never answers
// would otherwise block it forever.
const EnsureTopicsAttemptTimeout = 10 * time.Second

// EnsureTopics creates the topics that do not exist yet, through the cluster
// controller, and leaves existing ones untouched: it reads the cluster's
// metadata first and sends CreateTopics only for missing topics, so it needs
// no CREATE permission when every topic exists. It is meant for dev and the
// in-memory broker; production topics are managed outside scorer. dialer may
// be nil (kafka.DefaultDialer). ctx bounds the whole operation, and so does
// EnsureTopicsAttemptTimeout: every connection gets the earlier of the two
// as its I/O deadline and is closed as soon as ctx ends, so cancelling ctx
// (SIGTERM) unblocks it. Once ctx has ended the error wraps ctx.Err() (for
// the attempt timeout, context.DeadlineExceeded).
func EnsureTopics(ctx context.Context, brokers []string, dialer *kafka.Dialer, topics ...TopicSpec) error {
	return ensureTopics(ctx, EnsureTopicsAttemptTimeout, brokers, dialer, topics...)
}

// ensureTopics is EnsureTopics with the attempt timeout as a parameter, so
// tests need not wait for the real one.
func ensureTopics(ctx context.Context, timeout time.Duration, brokers []string, dialer *kafka.Dialer, topics ...TopicSpec) error {
	if len(topics) == 0 {
		return nil
	}
	if len(brokers) == 0 {
		return errors.New("producer: ensure topics: no brokers")
	}
	cfgs := make([]kafka.TopicConfig, 0, len(topics))
	for _, t := range topics {
		if t.Name == "" {
			return errors.New("producer: ensure topics: empty topic name")
		}
		tc := kafka.TopicConfig{Topic: t.Name, NumPartitions: max(t.Partitions, 1), ReplicationFactor: max(t.ReplicationFactor, 1)}
		for k, v := range t.Configs {
			tc.ConfigEntries = append(tc.ConfigEntries, kafka.ConfigEntry{ConfigName: k, ConfigValue: v})
		}
		cfgs = append(cfgs, tc)
	}
	if dialer == nil {
		dialer = kafka.DefaultDialer
	}
	// WithTimeout keeps ctx's deadline when that is earlier.
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()

	conn, err := dial(ctx, dialer, brokers[0])
	if err != nil {
		return fmt.Errorf("producer: ensure topics: dial %s: %w", brokers[0], err)
	}
	defer conn.Close()
	// Ask first, create only what is missing: on a cluster with ACLs a
	// principal without CREATE is refused even for topics that exist, and
	// an existing topic needs nothing. (Metadata for all topics, because
	// naming them would let a broker with auto.create.topics.enable create
	// them with its defaults instead of ours.)
	parts, err := conn.ReadPartitions()
	if err != nil {
		return fmt.Errorf("producer: ensure topics: metadata via %s: %w", brokers[0], ctxErr(ctx, err))
	}
	exists := make(map[string]bool, len(parts))
	for _, p := range parts {
		exists[p.Topic] = true
	}
	cfgs = slices.DeleteFunc(cfgs, func(tc kafka.TopicConfig) bool { return exists[tc.Topic] })
	if len(cfgs) == 0 {
		return nil
	}
	controller, err := conn.Controller()
	if err != nil {
		return fmt.Errorf("producer: ensure topics: find controller via %s: %w", brokers[0], ctxErr(ctx, err))
	}
	addr := net.JoinHostPort(controller.Host, strconv.Itoa(controller.Port))
	cc, err := dial(ctx, dialer, addr)
	if err != nil {
		return fmt.Errorf("producer: ensure topics: dial controller %s: %w", addr, err)
	}
	defer cc.Close()
	// CreateTopics ignores TopicAlreadyExists, so this is idempotent.
	if err := cc.CreateTopics(cfgs...); err != nil {
		return fmt.Errorf("producer: ensure topics: create on controller %s: %w", addr, ctxErr(ctx, err))
	}
	return nil
}

// dial connects to addr with ctx's deadline (which ensureTopics always sets)
// as the connection's I/O deadline, and closes the connection when ctx ends,
// which unblocks a request waiting on a silent broker. The close is released
// by the connection's own Close.
func dial(ctx context.Context, dialer *kafka.Dialer, addr string) (*closeOnDone, error) {
	conn, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, ctxErr(ctx, err)
	}
	if dl, ok := ctx.Deadline(); ok {
		if err := conn.SetDeadline(dl); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("set deadline: %w", err)
		}
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.Close() })
	return &closeOnDone{Conn: conn, stop: stop}, nil
}

// closeOnDone is a kafka.Conn that is also closed when its ctx ends.
type closeOnDone struct {
	*kafka.Conn
	stop func() bool
}

// Close stops the ctx watch and closes the connection.
func (c *closeOnDone) Close() error {
	c.stop()
	return c.Conn.Close()
}

// ctxErr returns err, wrapped with ctx's error once ctx has ended: an I/O
// error caused by the deadline or the close on cancel then says so, and
// errors.Is(err, context.Canceled) holds.
func ctxErr(ctx context.Context, err error) error {
	if cerr := ctx.Err(); cerr != nil && !errors.Is(err, cerr) {
		return fmt.Errorf("%w (%v)", cerr, err)
	}
	return err
}
