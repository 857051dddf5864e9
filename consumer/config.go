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
	DefaultMaxMessageBytes    = schema.DefaultMaxMessageBytes
	DefaultMaxInflightBatches = 2
	DefaultMaxUncommitted     = 1000
	DefaultCommitInterval     = time.Second
	DefaultShutdownTimeout    = 30 * time.Second
	// DefaultRevokeTimeout is the most RevokeTimeout defaults to; a short
	// rebalance or session timeout lowers it (see WithDefaults).
	DefaultRevokeTimeout    = 10 * time.Second
	DefaultSessionTimeout   = 30 * time.Second
	DefaultRebalanceTimeout = 30 * time.Second
	// DefaultHeartbeatInterval is the most HeartbeatInterval defaults to;
	// a session timeout under 9 s lowers it to a third of the session.
	DefaultHeartbeatInterval = 3 * time.Second
	DefaultRetryBackoff      = 200 * time.Millisecond
	DefaultRetryBackoffMax   = 10 * time.Second
	DefaultScoreAttempts     = 3
	DefaultOutageBackoffMax  = 30 * time.Second
	DefaultFetchMaxWait      = 500 * time.Millisecond
	DefaultJoinGroupBackoff  = time.Second
	// DefaultPartitionWatchInterval is how often the group leader checks
	// the input topic for new partitions (kafka-go's default).
	DefaultPartitionWatchInterval = 5 * time.Second
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
	// MaxUncommitted bounds each partition's uncommitted span: fetching of a
	// partition pauses while this many of its records were handed to
	// scoring past its last successful commit, acknowledged or not
	// (MAX_UNCOMMITTED), and resumes when a commit covers some of them.
	// Records are counted, not offsets (offsets have gaps). A crash
	// therefore replays at most this many already-handled records per
	// partition, also while commits keep failing (the member is then not
	// ready, but alive), and one stuck record cannot make the span, nor the
	// batches waiting behind it, grow without limit.
	MaxUncommitted int
	// Limits are passed to schema.DecodeEvent. The zero value means
	// schema.DefaultLimits(); MaxMessageBytes is forced to the one above.
	Limits schema.Limits

	// CommitInterval is the period of offset commits of each partition's
	// watermark. A commit also happens once at every generation end.
	CommitInterval time.Duration
	// ShutdownTimeout bounds the whole of Run's shutdown after its ctx
	// ends: waiting for in-flight work, the final commit and leaving the
	// group. The drain gets ShutdownTimeout minus a reserve (a quarter, at
	// most 3 s) for the rest; it is also capped at SessionTimeout −
	// HeartbeatInterval, with a warning from New, so that a member whose
	// heartbeats fail during the drain is not expired before its commit.
	ShutdownTimeout time.Duration
	// RevokeTimeout bounds the wait for in-flight work when a generation
	// ends (rebalance). RevokeTimeout + HeartbeatInterval must be shorter
	// than RebalanceTimeout (the member hears of the rebalance up to one
	// heartbeat late), and RevokeTimeout shorter than SessionTimeout −
	// HeartbeatInterval (heartbeats stop during a rebalance), or the broker
	// evicts this member while it drains. Zero means min(10 s,
	// (RebalanceTimeout − HeartbeatInterval)/2, (SessionTimeout −
	// HeartbeatInterval)/2). The commits before and after the drain wait
	// at most a third of what the rebalance timeout leaves each, so the
	// generation's whole end fits in it.
	RevokeTimeout time.Duration

	// Dialer carries TLS/SASL settings; nil means kafka.DefaultDialer with
	// ClientID. The partitions' fetch clients take its ClientID, Timeout,
	// TLS and SASLMechanism.
	Dialer *kafka.Dialer
	// ReadUncommitted makes the consumer read records of open and aborted
	// transactions too (KAFKA_ISOLATION_LEVEL=read_uncommitted). By
	// default it reads committed data only, as Kafka's own consumers do
	// with isolation.level=read_committed: an aborted transaction's records
	// are never scored, and a partition is read up to its last stable
	// offset, so an open transaction holds back what follows it.
	ReadUncommitted bool
	// SessionTimeout, RebalanceTimeout and HeartbeatInterval are the group
	// membership timings sent to the coordinator. HeartbeatInterval zero
	// means min(3 s, SessionTimeout/3).
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
	// records are scored one by one to find the failing ones. A failing
	// event is dead-lettered only if its error is permanent (it or a cause
	// has `Permanent() bool` returning true, or wraps schema.ErrInvalidEvent)
	// or the scorer is shown healthy after the failure (another event scores
	// on its own); otherwise the scorer is taken to be down and the events
	// are retried with backoff up to OutageBackoffMax for as long as the
	// generation lives.
	ScoreAttempts int
	// OutageBackoffMax caps the pause between rounds of retries while the
	// scorer fails for every event (GPU lost, pool closed, OOM under
	// contention).
	OutageBackoffMax time.Duration
	// FetchMaxWait is how long a partition fetch waits on the broker for new
	// data; it also bounds how quickly a fetcher notices it must stop.
	FetchMaxWait time.Duration
	// StartOffset is where a partition without a committed offset starts
	// (KAFKA_START_OFFSET, Kafka's auto.offset.reset): kafka.FirstOffset
	// (default) or kafka.LastOffset. It is also where a committed offset
	// past the log end resets to (one before the log start always resets to
	// the log start: see checkOffset).
	StartOffset int64
	// PartitionWatchInterval is how often partitions added to the input
	// topic are looked for; a new one triggers a rebalance that assigns it
	// (kafka-go's WatchPartitionChanges).
	PartitionWatchInterval time.Duration
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
	setInt(&cfg.MaxUncommitted, DefaultMaxUncommitted)
	if cfg.Limits == (schema.Limits{}) {
		cfg.Limits = schema.DefaultLimits()
	}
	cfg.Limits.MaxMessageBytes = cfg.MaxMessageBytes
	setDur(&cfg.CommitInterval, DefaultCommitInterval)
	setDur(&cfg.ShutdownTimeout, DefaultShutdownTimeout)
	setDur(&cfg.SessionTimeout, DefaultSessionTimeout)
	setDur(&cfg.RebalanceTimeout, DefaultRebalanceTimeout)
	setDur(&cfg.HeartbeatInterval, min(DefaultHeartbeatInterval, cfg.SessionTimeout/3))
	// Derived, not fixed: a fixed 10 s would make any rebalance timeout up
	// to 10 s (or a short session) invalid through a setting the operator
	// never chose.
	setDur(&cfg.RevokeTimeout, min(DefaultRevokeTimeout, (cfg.RebalanceTimeout-cfg.HeartbeatInterval)/2, (cfg.SessionTimeout-cfg.HeartbeatInterval)/2))
	setDur(&cfg.JoinGroupBackoff, DefaultJoinGroupBackoff)
	setDur(&cfg.RetryBackoff, DefaultRetryBackoff)
	setDur(&cfg.RetryBackoffMax, DefaultRetryBackoffMax)
	setInt(&cfg.ScoreAttempts, DefaultScoreAttempts)
	setDur(&cfg.OutageBackoffMax, DefaultOutageBackoffMax)
	setDur(&cfg.FetchMaxWait, DefaultFetchMaxWait)
	setDur(&cfg.PartitionWatchInterval, DefaultPartitionWatchInterval)
	if cfg.StartOffset == 0 {
		cfg.StartOffset = kafka.FirstOffset
	}
	cfg.Dialer = cfg.kafkaDialer()
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
		"ScoreAttempts": cfg.ScoreAttempts, "MaxUncommitted": cfg.MaxUncommitted,
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
		"JoinGroupBackoff": cfg.JoinGroupBackoff, "OutageBackoffMax": cfg.OutageBackoffMax,
		"PartitionWatchInterval": cfg.PartitionWatchInterval,
	}
	for name, d := range durations {
		if d <= 0 {
			errs = append(errs, fmt.Errorf("%s must be positive, got %v", name, d))
		}
	}
	if cfg.RevokeTimeout+cfg.HeartbeatInterval >= cfg.RebalanceTimeout {
		// The member learns of a rebalance at its next heartbeat (up to one
		// interval late), then drains for up to RevokeTimeout, then commits
		// and rejoins: all of it must fit in the rebalance timeout, or the
		// group evicts the member before its final commit.
		errs = append(errs, fmt.Errorf("RevokeTimeout %v + HeartbeatInterval %v must be shorter than RebalanceTimeout %v",
			cfg.RevokeTimeout, cfg.HeartbeatInterval, cfg.RebalanceTimeout))
	}
	if cfg.HeartbeatInterval >= cfg.SessionTimeout {
		errs = append(errs, fmt.Errorf("HeartbeatInterval %v must be shorter than SessionTimeout %v", cfg.HeartbeatInterval, cfg.SessionTimeout))
	} else if live := cfg.SessionTimeout - cfg.HeartbeatInterval; cfg.RevokeTimeout >= live {
		// Heartbeats stop when a rebalance starts; a longer drain lets the
		// session expire before the final commit.
		errs = append(errs, fmt.Errorf("RevokeTimeout %v must be shorter than SessionTimeout − HeartbeatInterval (%v)", cfg.RevokeTimeout, live))
	}
	if cfg.StartOffset != kafka.FirstOffset && cfg.StartOffset != kafka.LastOffset {
		errs = append(errs, fmt.Errorf("StartOffset must be kafka.FirstOffset or kafka.LastOffset, got %d", cfg.StartOffset))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("consumer: invalid config: %w", err)
	}
	return nil
}

// rebalanceCommitBudget is how long the end of a rebalance waits for each of
// its two commits (the probe before the drain, the final one after it):
// with the heartbeat that brings the news (up to HeartbeatInterval late)
// and the drain (RevokeTimeout), the whole end then fits in the rebalance
// timeout, and in the session timeout (no heartbeats are sent until the
// member rejoins), with a third of what is left to spare for rejoining.
// Validate's bounds on RevokeTimeout keep it positive.
func (cfg Config) rebalanceCommitBudget() time.Duration {
	return (min(cfg.RebalanceTimeout, cfg.SessionTimeout) - cfg.HeartbeatInterval - cfg.RevokeTimeout) / 3
}

// shutdownBudget splits ShutdownTimeout into the drain of in-flight work and
// a reserve for what follows it (final commit, leaving the group, and the
// caller closing its producer and scorer). The drain is also capped at
// SessionTimeout − HeartbeatInterval; clamped reports whether that cap cut
// it.
func (cfg Config) shutdownBudget() (drain time.Duration, clamped bool) {
	reserve := min(cfg.ShutdownTimeout/4, 3*time.Second)
	drain = cfg.ShutdownTimeout - reserve
	if live := cfg.SessionTimeout - cfg.HeartbeatInterval; drain > live {
		return live, true
	}
	return drain, false
}
