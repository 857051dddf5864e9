// Package streaming is the Kafka side of `scorer run`, as a library: the
// topics readied and sized from the input limits (Prepare), the producer of
// results, rows and dead letters sized to them (NewProducer), and the
// consumer that scores and publishes through them (NewConsumer). `scorer
// run` (internal/service) starts them in that order around the scoring
// stack; `scorer bench`'s pipeline starts the same ones, with its timing
// hooks as wrappers of the consumer's Scorer and Sink, so its figures are
// the service's.
package streaming

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/consumer"
	"github.com/scorer/scorer/internal/config"
	"github.com/scorer/scorer/internal/retry"
	"github.com/scorer/scorer/producer"
)

// Topics is what Prepare found and decided: the Kafka credentials and the
// producer's settings, its records sized to the topics' max.message.bytes.
type Topics struct {
	Security config.KafkaSecurity
	Producer producer.Config
}

// Prepare loads the Kafka credentials and readies the topics. Topics that
// exist are left alone (no CREATE permission needed); the missing ones get
// KAFKA_TOPIC_REPLICATION_FACTOR and a max.message.bytes that fits the
// largest record the input limits allow, and are created only when
// KAFKA_CREATE_TOPICS says so (a replication factor of -1 is the cluster's
// own default.replication.factor). singleNode is a broker of one node that
// starts empty (the in-memory broker of KAFKA_BROKERS=embedded, bench's
// child broker): its topics are always created, with replication factor 1.
// The output topics must fit every result the input limits accept, and the
// producer sizes its records to what they allow. A broker not reachable
// yet is waited for (with backoff, until ctx ends).
func Prepare(ctx context.Context, cfg config.Config, singleNode bool, log zerolog.Logger) (Topics, error) {
	sec, err := config.NewKafkaSecurity(&cfg)
	if err != nil {
		return Topics{}, err
	}
	rf, create := cfg.TopicReplication, cfg.CreateTopics || singleNode
	if singleNode {
		rf = 1
	}
	prodCfg := cfg.ProducerConfig(sec)
	plan, err := planTopics(cfg, prodCfg, rf)
	if err != nil {
		return Topics{}, err
	}
	limits, err := prepareTopicsRetry(ctx, cfg.KafkaBrokers, sec.Dialer(cfg.ClientID), create, plan.specs, log)
	if err != nil {
		if !create && errors.Is(err, kafka.UnknownTopicOrPartition) {
			err = fmt.Errorf("%w (KAFKA_CREATE_TOPICS=false: create them, or let the scorer create them with KAFKA_CREATE_TOPICS=true)", err)
		}
		if errors.Is(err, producer.ErrBrokerDefaultUnsupported) {
			err = fmt.Errorf("%w (KAFKA_TOPIC_REPLICATION_FACTOR=-1 asks the cluster for its default.replication.factor, which Kafka before 2.4 cannot do: set KAFKA_TOPIC_REPLICATION_FACTOR to the replication the topics need, at least the cluster's min.insync.replicas, or create the topics ahead)", err)
		}
		return Topics{}, err
	}
	if err := checkTopicLimits(cfg, prodCfg, plan, limits, log); err != nil {
		return Topics{}, err
	}
	prodCfg.TopicMaxBytes = map[string]int64{cfg.OutputTopic: limits[cfg.OutputTopic], cfg.DLQTopic: limits[cfg.DLQTopic]}
	if cfg.RowsTopic != "" {
		prodCfg.TopicMaxBytes[cfg.RowsTopic] = limits[cfg.RowsTopic]
	}
	return Topics{Security: sec, Producer: prodCfg}, nil
}

// NewProducer opens the producer of results, rows and dead letters with
// t's settings; the caller closes it after the consumer stopped.
func NewProducer(t Topics, log zerolog.Logger, reg prometheus.Registerer) (*producer.Producer, error) {
	return producer.New(t.Producer, log.With().Str("component", "producer").Logger(), reg)
}

// NewConsumer builds the consumer of cfg's input topic (with t's
// credentials) that scores with scorer and publishes to sink; Run runs it.
// The service passes the stack's transcript scorer and the producer; bench
// wraps both to time them.
func NewConsumer(cfg config.Config, t Topics, scorer consumer.Scorer, sink consumer.Sink, log zerolog.Logger, reg prometheus.Registerer) (*consumer.Consumer, error) {
	return consumer.New(cfg.ConsumerConfig(t.Security), scorer, sink, log, reg)
}

// prepareTopicsRetry readies the topics with producer.PrepareTopics
// (creating the missing ones when create is set) and returns their
// max.message.bytes. It retries with backoff what may heal (no broker
// reachable yet, a leader or controller not available, a timeout), so that
// a broker that starts after the scorer is waited for, with a clear log line
// each time, and returns at once what will not (an invalid replication
// factor, missing permissions, a failed authentication, a missing topic
// with creation off): retrying those would only hide them.
func prepareTopicsRetry(ctx context.Context, brokers []string, d *kafka.Dialer, create bool, topics []producer.TopicSpec, log zerolog.Logger) (map[string]int64, error) {
	backoff := retry.New(500*time.Millisecond, 15*time.Second)
	var limits map[string]int64
	err := retry.Do(ctx, backoff, 0, consumer.IsPermanent,
		func(attempt int, err error) {
			log.Warn().Err(err).Strs("brokers", brokers).Int("attempt", attempt).Dur("retry_in", backoff.Pause()).
				Msg("Kafka not reachable yet; retrying")
		},
		func() (err error) {
			limits, err = producer.PrepareTopics(ctx, brokers, d, create, topics...)
			return err
		})
	switch {
	case err == nil:
		return limits, nil
	case ctx.Err() != nil:
		return nil, fmt.Errorf("waiting for Kafka: %w", ctx.Err())
	default:
		return nil, fmt.Errorf("kafka: topics cannot be set up, and retrying will not help: %w", err)
	}
}
