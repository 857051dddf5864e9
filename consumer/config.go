package consumer

import (
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/scorer/scorer/schema"
)

// Defaults for Config's zero fields; they match docs/design.md where the
// design names a value.
const (
	DefaultTopic              = "transcripts"
	DefaultGroupID            = "scorer"
	DefaultClientID           = "scorer"
	DefaultBatchMaxMessages   = 16
	DefaultBatchMaxBytes      = 8 << 20
	DefaultBatchMaxWait       = 200 * time.Millisecond
	DefaultMaxMessageBytes    = 16 << 20
	DefaultMaxInflightBatches = 2
	DefaultCommitInterval     = time.Second
	DefaultShutdownTimeout    = 30 * time.Second
	DefaultRevokeTimeout      = 10 * time.Second
	DefaultSessionTimeout     = 30 * time.Second
	DefaultRebalanceTimeout   = 30 * time.Second
	DefaultHeartbeatInterval  = 3 * time.Second
	DefaultRetryBackoff       = 200 * time.Millisecond
	DefaultRetryBackoffMax    = 10 * time.Second
	DefaultScoreAttempts      = 3
	DefaultFetchMaxWait       = 500 * time.Millisecond
	DefaultJoinGroupBackoff   = time.Second
)

// Config configures a Consumer. Zero fields take the Default* values (see
// WithDefaults); Validate rejects combinations that cannot work. The config
// is copied by New and must not change afterwards.
type Config struct {
	// Brokers are the bootstrap addresses. Required.
	Brokers []string
	// Topic is the input topic of TranscriptEvents.
	Topic string
	// GroupID is the consumer group; its committed offsets are the resume
	// points after a restart or rebalance.
	GroupID string
	// ClientID is sent to the broker to identify this process in its logs
	// and quotas (ignored when Dialer is set: the Dialer carries it).
	ClientID string

	// BatchMaxMessages, BatchMaxBytes and BatchMaxWait bound one scoring
	// batch (BATCH_MAX_*). Bytes count record values; a record larger than
	// BatchMaxBytes is scored alone. Wait runs from the batch's oldest record.
	BatchMaxMessages int
	BatchMaxBytes    int
	BatchMaxWait     time.Duration

	// MaxMessageBytes: larger record values go to the DLQ with reason
	// too_large without being decoded (MAX_MESSAGE_BYTES).
	MaxMessageBytes int
	// MaxInflightBatches bounds batches between fetch and ack, including the
	// one being filled; when all are busy fetching pauses (backpressure).
	MaxInflightBatches int
	// Limits are passed to schema.DecodeEvent. The zero value means
	// schema.DefaultLimits(); MaxMessageBytes is forced to the one above.
	Limits schema.Limits

	// CommitInterval is the period of offset commits of each partition's
	// watermark. A commit also happens once at every generation end.
	CommitInterval time.Duration
	// ShutdownTimeout bounds how long Run waits for in-flight work after
	// its ctx ends before committing what is done and abandoning the rest.
	ShutdownTimeout time.Duration
	// RevokeTimeout bounds the wait for in-flight work when a generation
	// ends (rebalance). It must be shorter than RebalanceTimeout, or the
	// broker evicts this member while it drains.
	RevokeTimeout time.Duration

	// Dialer carries TLS/SASL settings; nil means kafka.DefaultDialer with
	// ClientID.
	Dialer *kafka.Dialer
	// SessionTimeout, RebalanceTimeout and HeartbeatInterval are the group
	// membership timings sent to the coordinator.
	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	HeartbeatInterval time.Duration
	// JoinGroupBackoff is the pause before rejoining after a group error.
	JoinGroupBackoff time.Duration
	// RetryBackoff is the first pause between retries of scoring, publish,
	// DLQ and fetch failures; it doubles up to RetryBackoffMax.
	RetryBackoff    time.Duration
	RetryBackoffMax time.Duration
	// ScoreAttempts is how many times a failing batch is scored before its
	// records are scored one by one and the failing ones dead-lettered.
	ScoreAttempts int
	// FetchMaxWait is how long a partition fetch waits on the broker for new
	// data; it also bounds how quickly a fetcher notices it must stop.
	FetchMaxWait time.Duration
	// StartOffset is where a partition without a committed offset starts:
	// kafka.FirstOffset (default) or kafka.LastOffset.
	StartOffset int64
}

// WithDefaults returns cfg with every zero field set to its default.
func (cfg Config) WithDefaults() Config {
	setStr := func(p *string, d string) {
		if *p == "" {
			*p = d
		}
	}
	setInt := func(p *int, d int) {
		if *p == 0 {
			*p = d
		}
	}
	setDur := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	setStr(&cfg.Topic, DefaultTopic)
	setStr(&cfg.GroupID, DefaultGroupID)
	setStr(&cfg.ClientID, DefaultClientID)
	setInt(&cfg.BatchMaxMessages, DefaultBatchMaxMessages)
	setInt(&cfg.BatchMaxBytes, DefaultBatchMaxBytes)
	setDur(&cfg.BatchMaxWait, DefaultBatchMaxWait)
	setInt(&cfg.MaxMessageBytes, DefaultMaxMessageBytes)
	setInt(&cfg.MaxInflightBatches, DefaultMaxInflightBatches)
	if cfg.Limits == (schema.Limits{}) {
		cfg.Limits = schema.DefaultLimits()
	}
	cfg.Limits.MaxMessageBytes = cfg.MaxMessageBytes
	setDur(&cfg.CommitInterval, DefaultCommitInterval)
	setDur(&cfg.ShutdownTimeout, DefaultShutdownTimeout)
	setDur(&cfg.RevokeTimeout, DefaultRevokeTimeout)
	setDur(&cfg.SessionTimeout, DefaultSessionTimeout)
	setDur(&cfg.RebalanceTimeout, DefaultRebalanceTimeout)
	setDur(&cfg.HeartbeatInterval, DefaultHeartbeatInterval)
	setDur(&cfg.JoinGroupBackoff, DefaultJoinGroupBackoff)
	setDur(&cfg.RetryBackoff, DefaultRetryBackoff)
	setDur(&cfg.RetryBackoffMax, DefaultRetryBackoffMax)
	setInt(&cfg.ScoreAttempts, DefaultScoreAttempts)
	setDur(&cfg.FetchMaxWait, DefaultFetchMaxWait)
	if cfg.StartOffset == 0 {
		cfg.StartOffset = kafka.FirstOffset
	}
	if cfg.Dialer == nil {
		cfg.Dialer = &kafka.Dialer{ClientID: cfg.ClientID, Timeout: 10 * time.Second, DualStack: true}
	}
	return cfg
}

// Validate reports the first problem with cfg (after WithDefaults), before
// any connection is opened.
func (cfg Config) Validate() error {
	var errs []error
	if len(cfg.Brokers) == 0 {
		errs = append(errs, errors.New("no brokers"))
	}
	if cfg.Topic == "" || cfg.GroupID == "" {
		errs = append(errs, errors.New("topic and group id are required"))
	}
	positive := map[string]int{
		"BatchMaxMessages": cfg.BatchMaxMessages, "BatchMaxBytes": cfg.BatchMaxBytes,
		"MaxMessageBytes": cfg.MaxMessageBytes, "MaxInflightBatches": cfg.MaxInflightBatches,
		"ScoreAttempts": cfg.ScoreAttempts,
	}
	for name, v := range positive {
		if v <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %d", name, v))
		}
	}
	durations := map[string]time.Duration{
		"BatchMaxWait": cfg.BatchMaxWait, "CommitInterval": cfg.CommitInterval,
		"ShutdownTimeout": cfg.ShutdownTimeout, "RevokeTimeout": cfg.RevokeTimeout,
		"SessionTimeout": cfg.SessionTimeout, "RebalanceTimeout": cfg.RebalanceTimeout,
		"HeartbeatInterval": cfg.HeartbeatInterval, "RetryBackoff": cfg.RetryBackoff,
		"RetryBackoffMax": cfg.RetryBackoffMax, "FetchMaxWait": cfg.FetchMaxWait,
		"JoinGroupBackoff": cfg.JoinGroupBackoff,
	}
	for name, d := range durations {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %v", name, d))
		}
	}
	if cfg.RevokeTimeout >= cfg.RebalanceTimeout {
		errs = append(errs, fmt.Errorf("RevokeTimeout %v must be shorter than RebalanceTimeout %v", cfg.RevokeTimeout, cfg.RebalanceTimeout))
	}
	if cfg.HeartbeatInterval >= cfg.SessionTimeout {
		errs = append(errs, fmt.Errorf("HeartbeatInterval %v must be shorter than SessionTimeout %v", cfg.HeartbeatInterval, cfg.SessionTimeout))
	}
	if cfg.StartOffset != kafka.FirstOffset && cfg.StartOffset != kafka.LastOffset {
		errs = append(errs, fmt.Errorf("StartOffset must be kafka.FirstOffset or kafka.LastOffset, got %d", cfg.StartOffset))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("consumer: invalid config: %w", err)
	}
	return nil
}
