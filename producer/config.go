package producer

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"
)

// Output keys for Config.Key.
const (
	// KeyCallID keys results by call_id and rows by (call_id, section,
	// sentence_index, label): every version of a call replaces the last.
	KeyCallID = "call_id"
	// KeyEntityEvent keys results by (entity_id, event_time) and rows by
	// (entity_id, event_time, section, sentence_index, label), the seed
	// table's dedup on ENTITY_ID + EVENT_DATETIME_UTC: versions of one
	// company event replace each other even under different call_ids.
	// Records without both parts are rejected (*PermanentError).
	KeyEntityEvent = "entity_event"
)

// Output formats for Config.Format.
const (
	// FormatJSON writes plain JSON values.
	FormatJSON = "json"
	// FormatConnect writes Kafka Connect JsonConverter envelopes
	// (schemas.enable=true) so Connect sinks need no schema registry.
	FormatConnect = "connect"
)

// Defaults applied by Validate to zero fields.
const (
	// DefaultCompression trades a little CPU for much smaller transcripts
	// (repetitive JSON compresses well); snappy is supported by every Kafka
	// client and Connect worker.
	DefaultCompression = "snappy"
	// DefaultBatchSize is the most records per produce request; rows can
	// be hundreds per transcript.
	DefaultBatchSize = 1000
	// DefaultBatchBytes matches the broker's default message.max.bytes
	// (1 MiB + overhead): the request size, and the record limit of a topic
	// missing from TopicMaxBytes.
	DefaultBatchBytes = 1 << 20
	// DefaultWriteTimeout bounds one produce request.
	DefaultWriteTimeout = 10 * time.Second
)

// Config configures a Producer. Zero fields take the defaults above; call
// Validate (New does) before use. Config must not change after New.
type Config struct {
	// Brokers are the bootstrap broker addresses (host:port). Required.
	Brokers []string
	// Topic receives ScoredTranscripts. Required.
	Topic string
	// RowsTopic, when set, receives one ScoreRow per section × sentence ×
	// label, keyed by RowKey. Empty = off.
	RowsTopic string
	// DLQTopic receives dead letters. Required for DeadLetter.
	DLQTopic string
	// Format is FormatJSON (default) or FormatConnect; it applies to values
	// on Topic and to keys and values on RowsTopic. DLQ records are always
	// the original bytes.
	Format string
	// Key is KeyCallID (default) or KeyEntityEvent; it applies to results,
	// rows and tombstones alike.
	Key string
	// Compression is none, gzip, snappy (default), lz4 or zstd.
	Compression string
	// BatchSize is the most records per produce request; default 1000.
	BatchSize int
	// BatchBytes bounds the records sent to one partition in one request
	// (a larger record goes alone), and is the largest record accepted for
	// a topic missing from TopicMaxBytes. Default 1 MiB.
	BatchBytes int64
	// TopicMaxBytes is each topic's max.message.bytes, as PrepareTopics
	// reports it. A record is accepted for a topic listed here when its
	// batch fits the limit whatever the compression does to it (see
	// RecordLimit); larger records fail with a *PermanentError naming them
	// (dead letters lose their value first, see DeadLetter) instead of a
	// broker rejection. Unlisted topics take BatchBytes.
	TopicMaxBytes map[string]int64
	// WriteTimeout bounds one produce request; default 10s.
	WriteTimeout time.Duration
	// Transport carries TLS/SASL settings; nil uses kafka.DefaultTransport.
	Transport *kafka.Transport
	// ClientID is sent to brokers for quotas and logs; default "scorer".
	// When Transport is nil a Transport with this ClientID is created.
	ClientID string
	// AllowAutoTopicCreation lets the first write create missing topics
	// (dev and the in-memory broker only; production topics are managed).
	AllowAutoTopicCreation bool
}

// Validate applies defaults to zero fields and rejects bad settings before
// anything connects, so misconfiguration fails at startup.
func (c *Config) Validate() error {
	var errs []error
	if len(c.Brokers) == 0 {
		errs = append(errs, errors.New("no brokers"))
	}
	for _, b := range c.Brokers {
		if strings.TrimSpace(b) == "" {
			errs = append(errs, errors.New("empty broker address"))
		}
	}
	if c.Topic == "" {
		errs = append(errs, errors.New("no output topic"))
	}
	if c.DLQTopic == "" {
		errs = append(errs, errors.New("no DLQ topic"))
	}
	if c.Topic != "" && (c.Topic == c.DLQTopic || c.Topic == c.RowsTopic) {
		errs = append(errs, fmt.Errorf("topic %q is used for two outputs", c.Topic))
	}
	if c.RowsTopic != "" && c.RowsTopic == c.DLQTopic {
		errs = append(errs, fmt.Errorf("topic %q is used for rows and DLQ", c.RowsTopic))
	}
	switch c.Format {
	case "":
		c.Format = FormatJSON
	case FormatJSON, FormatConnect:
	default:
		errs = append(errs, fmt.Errorf("format %q: want %s or %s", c.Format, FormatJSON, FormatConnect))
	}
	switch c.Key {
	case "":
		c.Key = KeyCallID
	case KeyCallID, KeyEntityEvent:
	default:
		errs = append(errs, fmt.Errorf("key %q: want %s or %s", c.Key, KeyCallID, KeyEntityEvent))
	}
	if c.Compression == "" {
		c.Compression = DefaultCompression
	}
	if _, err := compression(c.Compression); err != nil {
		errs = append(errs, err)
	}
	if c.BatchSize < 0 || c.BatchBytes < 0 || c.WriteTimeout < 0 {
		errs = append(errs, errors.New("negative batch size, bytes or write timeout"))
	}
	for t, n := range c.TopicMaxBytes {
		if c.RecordLimit(n) <= 0 {
			errs = append(errs, fmt.Errorf("topic %q: max.message.bytes %d leaves no room for a record", t, n))
		}
	}
	if c.BatchSize == 0 {
		c.BatchSize = DefaultBatchSize
	}
	if c.BatchBytes == 0 {
		c.BatchBytes = DefaultBatchBytes
	}
	if c.WriteTimeout == 0 {
		c.WriteTimeout = DefaultWriteTimeout
	}
	if c.ClientID == "" {
		c.ClientID = "scorer"
	}
	if len(errs) > 0 {
		return fmt.Errorf("producer: invalid config: %w", errors.Join(errs...))
	}
	return nil
}

// batchOverhead is what a record batch holding one record adds around the
// record's bytes (recordSize already counts the record's own framing): the
// 61-byte v2 batch header, with a wide margin.
const batchOverhead = 4096

// TopicBytes is the max.message.bytes a topic needs so that a record of n
// bytes (recordSize) is accepted in a batch of its own: the broker checks
// the batch after compression, and a codec can grow incompressible data
// (snappy's worst case is about n/6, lz4's, gzip's and zstd's far less), so
// a quarter is added unless Compression is none. RecordLimit is its inverse.
func (c Config) TopicBytes(n int64) int64 {
	if !strings.EqualFold(c.Compression, "none") {
		n += (n + 3) / 4
	}
	return n + batchOverhead
}

// RecordLimit is the largest record (recordSize) TopicBytes fits in a
// topic whose max.message.bytes is maxMessage.
func (c Config) RecordLimit(maxMessage int64) int64 {
	n := maxMessage - batchOverhead
	if !strings.EqualFold(c.Compression, "none") {
		n = n * 4 / 5
	}
	return n
}

// recordLimit is the largest record accepted for topic.
func (c *Config) recordLimit(topic string) int64 {
	if n, ok := c.TopicMaxBytes[topic]; ok {
		return c.RecordLimit(n)
	}
	return c.BatchBytes
}

func compression(name string) (kafka.Compression, error) {
	switch strings.ToLower(name) {
	case "none":
		return 0, nil
	case "gzip":
		return kafka.Gzip, nil
	case "snappy":
		return kafka.Snappy, nil
	case "lz4":
		return kafka.Lz4, nil
	case "zstd":
		return kafka.Zstd, nil
	default:
		return 0, fmt.Errorf("compression %q: want none, gzip, snappy, lz4 or zstd", name)
	}
}
