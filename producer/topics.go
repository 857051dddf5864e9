package producer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

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

// EnsureTopics creates the topics that do not exist yet, through the cluster
// controller, and leaves existing ones untouched. It is meant for dev and the
// in-memory broker; production topics are managed outside scorer. dialer may
// be nil (kafka.DefaultDialer). ctx bounds the whole operation.
func EnsureTopics(ctx context.Context, brokers []string, dialer *kafka.Dialer, topics ...TopicSpec) error {
	if len(topics) == 0 {
		return nil
	}
	if len(brokers) == 0 {
		return errors.New("producer: ensure topics: no brokers")
	}
	if dialer == nil {
		dialer = kafka.DefaultDialer
	}
	conn, err := dialer.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		return fmt.Errorf("producer: ensure topics: dial %s: %w", brokers[0], err)
	}
	defer conn.Close()
	controller, err := conn.Controller()
	if err != nil {
		return fmt.Errorf("producer: ensure topics: find controller: %w", err)
	}
	addr := net.JoinHostPort(controller.Host, strconv.Itoa(controller.Port))
	cc, err := dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return fmt.Errorf("producer: ensure topics: dial controller %s: %w", addr, err)
	}
	defer cc.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = cc.SetDeadline(dl)
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
	// CreateTopics ignores TopicAlreadyExists, so this is idempotent.
	if err := cc.CreateTopics(cfgs...); err != nil {
		return fmt.Errorf("producer: ensure topics: %w", err)
	}
	return nil
}
